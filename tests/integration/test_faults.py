"""Faults of the machine: a scheduler's SIGTERM/SIGUSR1, a full disk, out of GPU memory.

Real processes and real signals. The signal is sent at a known step by the run itself
(FASTTRAIN_FAULT_SIGNAL_AT, tests/integration/hooks), to the process a scheduler would signal: the
run, or under ddp its torchrun launcher, which passes it on to the workers.
"""

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from scratch import checkpoint_file, resuming_from, run, set_params
from test_resume import assert_same_state, final_model, per_epoch, scratch_repo, train_metrics

from fasttrain import checkpoint
from fasttrain.preemption import EXIT_PREEMPTED

# 3 epochs of 16 steps (single) or 2 x 16 steps (ddp, 2 ranks of 16 images a step)
PREEMPTIBLE = {"data": {"synthetic_train_size": 512, "augment": True},
               "train": {"epochs": 3, "scheduler": "onecycle", "device": "cpu", "nproc": 2}}


def _train(repo: Path, parallel: str, check: bool = True, env: dict | None = None):
    return run(["fasttrain", "train", "--parallel", parallel, "--precision", "fp32"], repo, timeout=600,
               check=check, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("parallel,sig", [("single", "SIGTERM"), ("ddp", "SIGTERM"), ("ddp", "SIGUSR1")])
def test_a_signal_mid_epoch_checkpoints_at_the_step_and_the_next_run_resumes_to_the_same_weights(
        tmp_path, parallel, sig):
    variant = f"{parallel}-fp32"
    whole = scratch_repo(tmp_path / "whole", PREEMPTIBLE)
    run(["fasttrain", "download"], whole)
    _train(whole, parallel)

    stopped = scratch_repo(tmp_path / "stopped", PREEMPTIBLE)
    shutil.copytree(whole / "data", stopped / "data")
    # onecycle: the lr changes every step, so a resume one step off would not end equal
    first = _train(stopped, parallel, check=False, env={"FASTTRAIN_FAULT_SIGNAL_AT": f"{sig}:0:2:3"})
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("fasttrain: stopped: ") and f"stopped by {sig}" in last, last
    assert "Traceback" not in first.stderr
    ckpt = checkpoint.load(checkpoint_file(stopped, variant))
    done = ckpt["state"]["epoch_steps"]
    if parallel == "single":  # the step in flight (3) finishes, and the checkpoint is at it
        assert (ckpt["state"]["epoch"], done) == (1, 3) and "at epoch 2, step 3;" in last
    else:  # the ranks agree every preemption.AGREE_EVERY_STEPS steps: at step 4, or a later one
        assert ckpt["state"]["epoch"] == 1 and 3 <= done < 16 and done % 4 == 0, done
    assert not (stopped / "models" / "seed0" / f"{variant}.pt").exists()
    assert [e for e, *_ in per_epoch(whole, variant)][:1] == ["1"]

    again = _train(stopped, parallel)
    assert re.search(rf"{resuming_from(variant)} after epoch 1 and {done} step\(s\) of epoch 2", again.stderr), again.stderr
    assert "epoch 1/3" not in again.stderr and "epoch 3/3" in again.stderr
    assert_same_state(final_model(stopped, variant), final_model(whole, variant))
    assert per_epoch(stopped, variant) == per_epoch(whole, variant)  # epoch losses summed over the same steps
    assert train_metrics(stopped, variant)["train_loss"] == train_metrics(whole, variant)["train_loss"]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graphs,scheduler", [(False, "onecycle"), (True, "plateau")])
def test_a_sigterm_on_the_gpu_resumes_to_the_same_weights_with_deterministic_kernels(tmp_path, graphs, scheduler):
    """train.deterministic on a GPU, single-bf16 AlexNet at 227 px (where every kernel it runs has a
    deterministic form): stopped by SIGTERM at epoch 2, step 3, and resumed, it ends bit for bit
    where the uninterrupted run ends, eagerly (onecycle: the lr moves every step) and replayed from
    CUDA graphs (captured again after the resume)."""
    params = {"data": {"synthetic_train_size": 512, "augment": True}, "model": {"name": "alexnet"},
              "train": {"epochs": 3, "batch_size": 32, "img_size": 227, "device": "cuda", "deterministic": True,
                        "cuda_graphs": True, "scheduler": scheduler}}  # onecycle: eager (switches.decide)
    cmd = ["fasttrain", "train", "--parallel", "single", "--precision", "bf16"]
    whole = scratch_repo(tmp_path / "whole", params)
    run(["fasttrain", "download"], whole)
    run(cmd, whole, timeout=600)
    stopped = scratch_repo(tmp_path / "stopped", params)
    shutil.copytree(whole / "data", stopped / "data")
    first = run(cmd, stopped, timeout=600, check=False, env={"FASTTRAIN_FAULT_SIGNAL_AT": "SIGTERM:0:2:3"})
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    assert "at epoch 2, step 3;" in first.stderr.strip().splitlines()[-1]
    again = run(cmd, stopped, timeout=600)
    assert "after epoch 1 and 3 step(s) of epoch 2" in again.stderr
    metrics = train_metrics(stopped, "single-bf16")
    assert metrics["deterministic"] is True and metrics["device"] != "cpu"
    assert metrics["cuda_graphs"] is graphs
    assert_same_state(final_model(stopped, "single-bf16"), final_model(whole, "single-bf16"))
    assert per_epoch(stopped, "single-bf16") == per_epoch(whole, "single-bf16")


_SAVER = textwrap.dedent("""
    import os, signal, sys, torch
    from fasttrain import atomic, checkpoint, parallel, preemption
    path = sys.argv[1]
    checkpoint.save({"model": {"w": torch.full((2**22,), 1.0)}, "marker": 1}, path)
    real_fdopen = os.fdopen
    class SignalledMidWrite:  # SIGTERM arrives half-way through the bytes of the next save
        def __init__(self, f): self.f, self.sent = f, False
        def __enter__(self): return self
        def __exit__(self, *exc): self.f.close()
        def __getattr__(self, name): return getattr(self.f, name)
        def write(self, data):
            n = self.f.write(data[: len(data) // 2])
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
            return n + self.f.write(data[len(data) // 2:])
    atomic.os.fdopen = lambda *a, **k: SignalledMidWrite(real_fdopen(*a, **k))
    with preemption.stop_on_signals(parallel.Runtime("single", torch.device("cpu"))) as stop:
        checkpoint.save({"model": {"w": torch.full((2**22,), 2.0)}, "marker": 2}, path)
        sys.exit(preemption.EXIT_PREEMPTED if stop.agreed(1) else 0)
""")


def test_sigterm_during_a_save_finishes_the_save_then_stops(tmp_path):
    """The handler only raises a flag: the save in progress completes (and were the process killed
    instead, the atomic write keeps the previous file: test_resume's SIGKILL-during-a-save tests)."""
    path = tmp_path / "last.pt"
    proc = subprocess.run([sys.executable, "-c", _SAVER, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr
    saved = checkpoint.load(path)
    assert saved["marker"] == 2 and torch.equal(saved["model"]["w"], torch.full((2**22,), 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


# --- out of memory -----------------------------------------------------------------------------

def test_out_of_memory_in_the_step_is_one_line_naming_the_shapes_and_what_to_change(tmp_path, monkeypatch):
    from fasttrain import config, parallel
    from fasttrain.data import make_synthetic, save_dataset
    from fasttrain.errors import FasttrainError
    from fasttrain.layout import Layout
    from fasttrain.precision import PRECISIONS
    from fasttrain.train import train
    from scratch import TINY

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    params = config.from_dict({**TINY, "train": {**TINY["train"], "device": "cpu"}})

    def step(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                     "capacity of 139.80 GiB of which 1.00 GiB is free.")

    monkeypatch.setattr("fasttrain.train.train_step", step)
    with pytest.raises(FasttrainError) as e:
        train(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout, log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("single-fp32: out of memory in epoch 1: train.batch_size 32, img_size 32 px, "
                          "precision fp32; the CPU has "), msg
    assert msg.endswith("and asked for 2.00 GiB: use a smaller train.batch_size, train.img_size, "
                        "or a half precision (bf16, amp)"), msg
    assert not layout.model("single-fp32").exists()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_batch_that_cannot_fit_fails_before_the_first_epoch_and_frees_its_gpu(tmp_path, monkeypatch):
    """AlexNet at 512 px, 16,384 images a step: a 51 GB input batch and far more activations."""
    from fasttrain import lease

    repo = scratch_repo(tmp_path / "repo", {
        "data": {"synthetic_train_size": 16384}, "model": {"name": "alexnet"},
        "train": {"batch_size": 16384, "img_size": 512, "device": "auto"}})
    run(["fasttrain", "download"], repo)
    for graphs in (True, False):  # the graph capture's warm-up, and the eager path's
        set_params(repo, {"train": {"cuda_graphs": graphs}})
        failed = _train(repo, "single", check=False)
        assert failed.returncode == 1, failed.stderr[-3000:]
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("fasttrain: error: single-fp32: out of memory in the warm-up at the real shapes, "
                               "before the first epoch: train.batch_size 16384, img_size 512 px, precision fp32; "), last
        assert "GiB" in last and "use a smaller train.batch_size" in last and "Traceback" not in failed.stderr
        assert "epoch 1/1" not in failed.stderr
        print(last)
    monkeypatch.setenv("FASTTRAIN_LEASE_TIMEOUT", "0")  # the lease ended with the process: free at once
    lease.hold(1).release()
