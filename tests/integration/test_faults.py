"""Faults of the machine (issue 21): a scheduler's SIGTERM/SIGUSR1, a full disk, out of GPU memory.

Real processes and real signals. The signal is sent at a known step by the run itself
(FASTTRAIN_FAULT_SIGNAL_AT, parallel.inject_fault), to the process a scheduler would signal: the
run, or under ddp its torchrun launcher, which passes it on to the workers.
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from scratch import run
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
    ckpt = checkpoint.load(stopped / "checkpoints" / variant / "last.pt")
    done = ckpt["state"]["epoch_steps"]
    if parallel == "single":  # the step in flight (3) finishes, and the checkpoint is at it
        assert (ckpt["state"]["epoch"], done) == (1, 3) and "at epoch 2, step 3;" in last
    else:  # the ranks agree every preemption.AGREE_EVERY_STEPS steps: at step 4, or a later one
        assert ckpt["state"]["epoch"] == 1 and 3 <= done < 16 and done % 4 == 0, done
    assert not (stopped / "models" / f"{variant}.pt").exists()
    assert [e for e, *_ in per_epoch(whole, variant)][:1] == ["1"]

    again = _train(stopped, parallel)
    assert f"resuming from checkpoints/{variant}/last.pt after epoch 1 and {done} step(s) of epoch 2" in again.stderr
    assert "epoch 1/3" not in again.stderr and "epoch 3/3" in again.stderr
    assert_same_state(final_model(stopped, variant), final_model(whole, variant))
    assert per_epoch(stopped, variant) == per_epoch(whole, variant)  # epoch losses summed over the same steps
    assert train_metrics(stopped, variant)["final_train_loss"] == train_metrics(whole, variant)["final_train_loss"]


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
