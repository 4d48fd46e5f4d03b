"""What the train metrics say, against cases whose answers are known: the plateau schedule's lr cut,
GradScaler's skipped steps and final scale, the seed, and peak memory as the maximum over ddp ranks."""

import math
import os
import shutil
import sys
import textwrap
import time
import warnings

import pytest
import torch
from scratch import REPO, TINY, copy_repo, record, run, set_params

from fasttrain import config, engine, parallel
from fasttrain.data import make_synthetic, save_dataset
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS
from fasttrain.train import train


def _params(seed: int = 0, **train):
    return config.from_dict({**TINY, "train": {**TINY["train"], "device": "cpu", **train}}).for_seed(seed)


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
    assert math.isfinite(metrics["train_loss"])  # the loss itself was finite: a skip is no failure


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
    metrics = record(repo, "ddp-fp32")
    assert metrics["world_size"] == 2 and metrics["peak_memory_kind"] == "cpu_max_rss"
    assert 50 * 1024 < metrics["peak_memory_mb"] < 60 * 1024
    assert metrics["warnings"] == ["train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)",
                                   "train.sync_bn ignored: SyncBatchNorm needs GPUs"]


def _timed_work_folder(root, monkeypatch, run_params=None, **train):
    """A work folder with params.yaml (TINY on the CPU plus `train`, and `run`) and a 64-image data set, as cwd."""
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    set_params(root, {**TINY, "train": {**TINY["train"], "device": "cpu", **train}, "run": {**TINY["run"], **(run_params or {})}})
    _layout(root)
    monkeypatch.chdir(root)


def test_the_metrics_say_where_the_process_time_went_phase_by_phase(tmp_path, monkeypatch):
    """Known delays put in known places land in their phases: 0.3 s in loading the data set
    (prepare), 0.2 s in each of the 2 checkpoint saves (none after the last epoch) and in the final
    model's save, 0.1 s in each
    of the 3 per-epoch evaluations; and the phases with `other` add up to the total, which is no
    more than the wall time measured around the command. Then `fasttrain evaluate` alike."""
    import fasttrain
    import fasttrain.train as train_module
    from fasttrain import checkpoint, clock
    from fasttrain.cli import main as cli_main

    _timed_work_folder(tmp_path, monkeypatch, epochs=3, run_params={"checkpoint_every": 1})
    real_save, real_load, real_eval = checkpoint.save, train_module.load_dataset, train_module.evaluate_model
    monkeypatch.setattr(checkpoint, "save", lambda obj, path, what="a training checkpoint":
                        (time.sleep(0.2), real_save(obj, path, what))[1])
    monkeypatch.setattr(train_module, "load_dataset", lambda path: (time.sleep(0.3), real_load(path))[1])
    monkeypatch.setattr(train_module, "evaluate_model", lambda *a, **k: (time.sleep(0.1), real_eval(*a, **k))[1])
    monkeypatch.setattr(fasttrain, "STARTED", time.perf_counter())  # as if this process had just started
    monkeypatch.setattr(clock, "_begun", False)
    start = time.perf_counter()
    cli_main(["train", "--parallel", "single", "--precision", "fp32"])
    wall = time.perf_counter() - start
    m = record(tmp_path, "single-fp32")
    p = m["process_seconds"]
    assert set(p) == {"start_up", "runtime", "prepare", "warm_up", "train", "eval", "checkpoints", "final_model",
                      "other", "total"}
    assert m["checkpoints_written"] == 2
    assert 0.4 <= p["checkpoints"] < 0.4 + wall / 2 and 0.2 <= p["final_model"] < 0.2 + wall / 2
    assert p["prepare"] >= 0.3 and p["eval"] >= 0.3
    assert sum(v for k, v in p.items() if k != "total") == pytest.approx(p["total"], abs=0.01)
    assert 0 <= p["other"] and p["total"] <= wall
    assert p["train"] >= m["train_seconds"] - 0.01  # the epochs' timed steps happen inside the train phase
    assert min(p.values()) >= 0

    monkeypatch.setattr(fasttrain, "STARTED", time.perf_counter())
    start = time.perf_counter()
    cli_main(["evaluate", "--parallel", "single", "--precision", "fp32"])
    wall = time.perf_counter() - start
    p = record(tmp_path, "single-fp32", "evaluate")["process_seconds"]
    assert set(p) == {"start_up", "runtime", "prepare", "eval", "other", "total"}
    assert sum(v for k, v in p.items() if k != "total") == pytest.approx(p["total"], abs=0.01)
    assert 0 <= p["other"] and p["total"] <= wall and min(p.values()) >= 0


def test_a_commands_start_up_counts_from_the_process_start_not_from_its_own_imports(tmp_path, monkeypatch):
    """A real process that imports fasttrain, then spends 4 s (as a slow file system's imports
    would) before it runs `fasttrain train`: those 4 s are start-up, so the clock started when the
    process did, not when the command's modules were imported. Its total is no more than the wall
    time measured around the process."""
    _timed_work_folder(tmp_path, monkeypatch, epochs=1)
    script = "import sys, time, fasttrain; time.sleep(4); from fasttrain.cli import main; main(sys.argv[1:])"
    start = time.perf_counter()
    run([sys.executable, "-c", script, "train", "--parallel", "single", "--precision", "fp32"], tmp_path)
    wall = time.perf_counter() - start
    p = record(tmp_path, "single-fp32")["process_seconds"]
    assert 4 <= p["start_up"] and p["total"] <= wall
    assert p["start_up"] + p["runtime"] + p["prepare"] + p["warm_up"] + p["train"] + p["eval"] \
        + p["checkpoints"] + p["final_model"] + p["other"] == pytest.approx(p["total"], abs=0.01)


def test_a_first_step_gradscaler_skips_is_explained_in_the_log_not_by_torchs_order_warning(tmp_path, monkeypatch):
    """amp under the one-cycle schedule, the first step's gradients infinite: GradScaler skips the
    optimizer's step, the schedule steps anyway, and torch would warn that lr_scheduler.step() came
    before optimizer.step(). The log says in one line what happened; torch's warning is not shown."""
    backward = []
    real_build = engine.build_trainable

    def build(*args, **kwargs):
        t = real_build(*args, **kwargs)
        first = next(t.raw.parameters())
        first.register_hook(lambda g: (backward.append(1), g * math.inf if len(backward) == 1 else g)[1])
        return t

    monkeypatch.setattr("fasttrain.train.build_trainable", build)
    logs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = train(_params(epochs=2, scheduler="onecycle"), PRECISIONS["amp"], parallel.setup("single", "cpu"),
                        _layout(tmp_path), log=logs.append)
    assert metrics["grad_scaler_skipped_steps"] == 1
    explained = [m for m in logs if "GradScaler skipped the first step" in m]
    assert len(explained) == 1 and "\n" not in explained[0], logs
    assert not [w for w in caught if "before `optimizer.step()`" in str(w.message)], [str(w.message) for w in caught]

    # a run whose first step is not skipped: no such line
    logs.clear()  # (the hook poisons its first call only, long past)
    (tmp_path / "clean").mkdir()
    train(_params(epochs=1, scheduler="onecycle"), PRECISIONS["amp"], parallel.setup("single", "cpu"),
          _layout(tmp_path / "clean"), log=logs.append)
    assert not [m for m in logs if "GradScaler skipped" in m], logs
