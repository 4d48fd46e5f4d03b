"""What the train metrics say, against cases whose answers are known: the plateau schedule's lr cut,
GradScaler's skipped steps and final scale, the seed, and peak memory as the maximum over ddp ranks."""

import json
import math
import os
import textwrap

import pytest
import torch
from scratch import TINY, copy_repo, run, set_params

from fasttrain import config, engine, parallel
from fasttrain.data import make_synthetic, save_dataset
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS
from fasttrain.train import train


def _params(**train):
    return config.from_dict({**TINY, "train": {**TINY["train"], "device": "cpu", **train}})


def _layout(root) -> Layout:
    layout = Layout(root)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)  # 2 steps of 32 an epoch
    return layout


def test_the_plateau_schedule_cuts_the_lr_once_the_loss_has_not_improved_for_more_than_patience_epochs(
        tmp_path, monkeypatch):
    """patience 2: two epochs without a lower train loss are borne, the third cuts the lr by
    plateau_factor, and the epoch after it trains at the cut lr."""
    epoch_loss = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95]  # best after epoch 2; epochs 3, 4, 5 do no better
    lrs, steps = [], []

    def step(t, precision, x, y):  # no training: the loss the schedule sees is the one given here
        lrs.append(t.optimizer.param_groups[0]["lr"])
        steps.append(1)
        return torch.tensor(epoch_loss[(len(steps) - 1) // 2]), None

    monkeypatch.setattr("fasttrain.train.train_step", step)
    layout = _layout(tmp_path)
    train(_params(epochs=7, lr=1e-3, scheduler="plateau", plateau_patience=2, plateau_factor=0.5),
          PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout, log=lambda msg: None)
    per_epoch = [lrs[i] for i in range(0, 14, 2)]
    assert lrs[::2] == lrs[1::2]  # one lr through each epoch
    assert per_epoch == pytest.approx([1e-3] * 5 + [5e-4] * 2, rel=1e-12)


def test_under_amp_the_metrics_count_the_steps_gradscaler_skipped_and_give_its_final_scale(tmp_path, monkeypatch):
    """Steps 2 and 3 of 4 get infinite gradients: GradScaler skips both and halves its scale for
    each, from 65536 (torch's initial scale) to 16384; 2000 clean steps would be needed to double it."""
    poisoned, backward = {2, 3}, []
    real_build = engine.build_trainable

    def build(*args, **kwargs):
        t = real_build(*args, **kwargs)
        first = next(t.raw.parameters())
        first.register_hook(lambda g: (backward.append(1), g * math.inf if len(backward) in poisoned else g)[1])
        return t

    monkeypatch.setattr("fasttrain.train.build_trainable", build)
    layout = _layout(tmp_path)
    metrics = train(_params(epochs=2), PRECISIONS["amp"], parallel.setup("single", "cpu"), layout, log=lambda m: None)
    assert len(backward) == 4
    assert metrics["grad_scaler_skipped_steps"] == 2
    assert metrics["grad_scaler_final_scale"] == 16384.0
    assert math.isfinite(metrics["final_train_loss"])  # the loss itself was finite: a skip is no failure


def test_the_seed_is_recorded_and_decides_the_run(tmp_path, monkeypatch):
    """The seed decides the initial weights and the order of the training images, each on its own
    (either would tell two trained models apart without the other), and a whole run: the same seed
    trains the same weights."""
    rt = parallel.setup("single", "cpu")
    initial = {seed: engine.build_trainable(_params(seed=seed), PRECISIONS["fp32"], rt, 10).raw.state_dict()
               for seed in (5, 6)}
    assert not all(torch.equal(initial[5][k], initial[6][k]) for k in initial[5])
    weights, metrics, labels = {}, {}, {}
    real_step = engine.train_step
    monkeypatch.setattr("fasttrain.train.train_step", lambda t, p, x, y: (labels[name].append(y.tolist()),
                                                                          real_step(t, p, x, y))[1])
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        labels[name] = []
        layout = _layout(tmp_path / name)
        metrics[name] = train(_params(seed=seed), PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout,
                              log=lambda m: None)
        weights[name] = torch.load(layout.model("single-fp32"), weights_only=True)["model"]
    assert [m["seed"] for m in metrics.values()] == [5, 5, 6]
    assert labels["a"] == labels["b"] and labels["a"] != labels["c"]  # the images' order, by the labels
    assert metrics["a"]["grad_scaler_final_scale"] is None and metrics["a"]["grad_scaler_skipped_steps"] == 0  # fp32
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])
    assert not all(torch.equal(weights["a"][k], weights["c"][k]) for k in weights["a"])


# Rank 0's peak resident memory reads 40 GiB higher than it is, rank 1's 50 GiB: the maximum over
# ranks is 50-60 GiB, where rank 0's own figure (40-50) and the sum over ranks (over 90) are not.
INFLATE_RANKS = textwrap.dedent("""
    import os, resource
    _extra_gib = {"0": 40, "1": 50}.get(os.environ.get("RANK"))
    if _extra_gib:
        _getrusage = resource.getrusage
        def getrusage(who):
            r = _getrusage(who)
            return resource.struct_rusage((r[0], r[1], r[2] + _extra_gib * 2**20, *r[3:]))  # ru_maxrss is in KiB
        resource.getrusage = getrusage
""")


@pytest.mark.slow
def test_ddp_metrics_give_the_peak_memory_of_the_rank_that_used_most_and_the_sync_bn_warning(tmp_path):
    """Two gloo processes; a sitecustomize makes rank 0's peak memory read 40 GiB more than it is, and
    rank 1's 50 GiB more."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(INFLATE_RANKS)
    repo = copy_repo(tmp_path / "repo")
    set_params(repo, TINY)
    set_params(repo, {"train": {"device": "cpu", "nproc": 2, "sync_bn": True}})
    run(["fasttrain", "download"], repo)
    pythonpath = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    run(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], repo, timeout=600,
        env={"PYTHONPATH": pythonpath})
    metrics = json.loads((repo / "metrics" / "train" / "ddp-fp32.json").read_text())
    assert metrics["world_size"] == 2 and metrics["peak_memory_kind"] == "cpu_max_rss"
    assert 50 * 1024 < metrics["peak_memory_mb"] < 60 * 1024
    assert metrics["warnings"] == ["train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)",
                                   "train.sync_bn ignored: SyncBatchNorm needs GPUs"]
