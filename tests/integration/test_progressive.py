"""Progressive resizing: the first `progressive_epochs` train at `progressive_size`, the rest at
`img_size`, and test accuracy is measured at `img_size` throughout."""

import csv
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from scratch import TINY, record

from fasttrain import config, engine, parallel
from fasttrain.data import make_synthetic, save_dataset
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS
from fasttrain.train import train, train_sizes


def test_the_first_epochs_train_small_the_rest_and_every_evaluation_at_img_size(tmp_path, monkeypatch):
    layout = Layout(tmp_path)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)  # 2 training steps an epoch
    params = config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 3, "img_size": 32, "device": "cpu",
                                                 "progressive_epochs": 2, "progressive_size": 20}})
    assert train_sizes(params.train) == [20, 32]
    seen = {"train": [], "eval": []}
    real_build = engine.build_trainable

    def build(*args, **kwargs):  # every input the model gets, by mode
        t = real_build(*args, **kwargs)
        t.raw.register_forward_pre_hook(
            lambda m, inputs: seen["train" if m.training else "eval"].append(inputs[0].shape[-1]))
        return t

    monkeypatch.setattr("fasttrain.train.build_trainable", build)
    # A clock that only training steps move: 0.5 s a step at 20 px, 0.125 s at 32 px, so the epochs
    # take 1.0, 1.0 and 0.25 s and every figure below is worked out by hand.
    clock, real_step = [0.0], engine.train_step

    def step(t, precision, x, y):
        clock[0] += {20: 0.5, 32: 0.125}[x.shape[-1]]
        return real_step(t, precision, x, y)

    monkeypatch.setattr("fasttrain.train.train_step", step)
    monkeypatch.setattr("fasttrain.train.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    logs = []
    metrics = train(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout, log=logs.append)

    assert seen["train"] == [20, 20, 20, 20, 32, 32]
    assert set(seen["eval"]) == {32} and len(seen["eval"]) == 3  # one 50-image batch after each epoch
    with open(layout.train_plot("single-fp32")) as f:
        rows = list(csv.DictReader(f))
    assert [r["img_size"] for r in rows] == ["20", "20", "32"]
    # steady: epoch 3 alone, the one at img_size after the first: 64 images in 0.25 s (all three
    # epochs would give 192 / 2.25 = 85.3, epochs 2-3 128 / 1.25 = 102.4); train_seconds: every epoch
    assert metrics["images_per_second"] == 256.0 and metrics["epoch_seconds"] == 0.25
    assert metrics["first_epoch_seconds"] == 1.0 and metrics["train_seconds"] == 2.25
    assert [r["epoch_seconds"] for r in rows] == ["1.000", "1.000", "0.250"]
    assert [m.split("  ")[0].split(": ")[1] for m in logs if " epoch " in m] == [
        "epoch 1/3 at 20 px", "epoch 2/3 at 20 px", "epoch 3/3 at 32 px"]


def test_without_progressive_epochs_every_epoch_trains_at_img_size():
    params = config.from_dict({**TINY, "train": {**TINY["train"], "progressive_size": 20}})
    assert params.train.progressive_epochs == 0 and train_sizes(params.train) == [32]


@pytest.mark.slow
def test_compile_warms_up_both_sizes_so_no_epoch_compiles(tmp_path, monkeypatch):
    """torch.compile (inductor on the CPU, ~1.5 min). The first run is a real `fasttrain train` process
    with an empty compile cache: the warm-up compiles the full batch's graph at both sizes, counted
    in compile_seconds, and the process ends once its outputs are written (a cold compile leaves
    inductor's idle compile threads behind, which the exit must tell to end). 80 images at batch
    32: each epoch ends on a short batch of 16, which runs the same model eagerly, so it costs no
    compile and still trains (every epoch counts 80 images). The same run again, in this process,
    another folder and another seed, finds both graphs in the cache; there epoch 1's evaluation adds
    the eval-mode graph and then no epoch, not even the first at img_size, compiles anything."""
    from torch._dynamo.utils import counters

    cache = tmp_path / "compile-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    params = config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 3, "img_size": 32, "device": "cpu",
                                                 "progressive_epochs": 1, "progressive_size": 20, "compile": True}})
    first = tmp_path / "first"
    save_dataset(make_synthetic(80, 10, 32, 0), Layout(first).dataset)
    raw = config.to_dict(params)
    raw["train"].pop("seed")  # the run's, given as --seed, not a params.yaml key
    (first / "params.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "fasttrain", "train", "--parallel", "single", "--precision", "fp32"],
                          cwd=first, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    metrics = record(first, "single-fp32")
    assert metrics["compile_seconds"] > 0
    each = metrics["compile_seconds_each"]  # batch x pixels: the full batch at each size, not the short one
    assert set(each) == {"32x20", "32x32"} and sum(each.values()) == pytest.approx(metrics["compile_seconds"], abs=0.01)
    # every epoch trained all 80 images: the steady rate times the steady epoch's seconds
    assert metrics["images_per_second"] * metrics["epoch_seconds"] == pytest.approx(80, rel=1e-2)
    assert metrics["compile_cache"]["aot_autograd"] == {"hit": 0, "miss": 2, "bypass": 0}
    assert metrics["compile_cache"]["inductor"]["hit"] == 0 and metrics["compile_cache"]["inductor"]["miss"] > 0
    assert metrics["compile_workers"] >= 1
    assert f"; 0 of 2 graph(s) from the compile cache {cache}\n" in proc.stderr

    again = Layout(tmp_path / "again")
    save_dataset(make_synthetic(80, 10, 32, 0), again.dataset)
    seeded = params.for_seed(1)
    graphs = {}

    def log(msg):
        graphs[msg.split("  ")[0]] = counters["stats"]["unique_graphs"]

    torch._dynamo.reset()  # as a new process: no code dynamo compiled earlier in this one, only the caches on disk
    before = counters["stats"]["unique_graphs"]
    cached = train(seeded, PRECISIONS["fp32"], parallel.setup("single", "cpu"), again, log=log)
    assert cached["compile_cache"]["aot_autograd"] == {"hit": 2, "miss": 0, "bypass": 0}
    assert cached["compile_cache"]["inductor"]["miss"] == 0
    assert any(m.endswith(f"; 2 of 2 graph(s) from the compile cache {cache}") for m in graphs), list(graphs)
    compiled = next(n for msg, n in graphs.items() if msg.startswith("single-fp32: compiled in ")) - before
    assert compiled == 2  # one training graph per size
    after_epoch_1 = graphs["single-fp32: epoch 1/3 at 20 px"]
    assert graphs["single-fp32: epoch 2/3 at 32 px"] == graphs["single-fp32: epoch 3/3 at 32 px"] == after_epoch_1
