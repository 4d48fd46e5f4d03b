"""Nothing lost: atomic checkpoints, exact resume, torchrun restarts.

Real processes and real signals: `fasttrain` and `dvc` run as subprocesses in scratch copies of the
repo, and are killed with SIGKILL or interrupted with SIGINT the way a crash or a Ctrl-C would.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torchvision
from scratch import (BIN, TINY, alive, checkpoint_file, checkpoint_of, copy_repo, epoch_gate, hooked, record,
                     resuming_from, run, set_params)

from fasttrain import checkpoint, config, engine, parallel
from fasttrain.atomic import DiskError
from fasttrain.errors import FasttrainError
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS
from fasttrain.preemption import EXIT_PREEMPTED
from fasttrain.train import train

# Three epochs of 16 steps: long enough to be killed mid-epoch, short enough to run three times.
RESUMABLE = {
    "data": {"synthetic_train_size": 512, "augment": True},
    "train": {"epochs": 3, "scheduler": "plateau", "plateau_patience": 0, "plateau_factor": 0.5,
              "device": "cpu"},  # bit-exact comparisons: the CPU, even on a machine with GPUs
}
SIGKILLED = -signal.SIGKILL


def env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}


def scratch_repo(path: Path, *overrides: dict) -> Path:
    repo = copy_repo(path)
    for o in (TINY, *overrides):
        set_params(repo, o)
    return repo


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 300, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def sigint_as_a_terminal_gives_it() -> None:
    """For a process the test then Ctrl-C's: SIGINT at its default. A process started in the background
    by a non-interactive shell (a CI runner's `cmd &`) has SIGINT ignored, every process under it
    inherits that across exec, and a dvc or fasttrain started so would ignore the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def final_model(repo: Path, variant: str) -> dict:
    return torch.load(repo / "models" / "seed0" / f"{variant}.pt", weights_only=True)["model"]


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert torch.equal(v, b[k]), k


def per_epoch(repo: Path, variant: str) -> list[tuple[str, str, str]]:
    """The per-epoch table without its timings: epoch, loss, accuracy, lr."""
    with open(repo / "plots" / "train" / "seed0" / f"{variant}.csv") as f:
        return [(r["epoch"], r["train_loss"], r["test_accuracy"], r["lr"]) for r in csv.DictReader(f)]


def crash_at(monkeypatch, step: int):
    """Training's step raises at its `step`-th call (from 1), in this process; returns the real one."""
    real, steps = engine.train_step, []

    def crashing(t, precision, x, y):
        steps.append(1)
        if len(steps) == step:
            raise RuntimeError("crash")
        return real(t, precision, x, y)

    monkeypatch.setattr("fasttrain.train.train_step", crashing)
    return real


def train_metrics(repo: Path, variant: str) -> dict:
    return record(repo, variant)


# --- 1. SIGKILL mid-epoch, then resume: the same result as an uninterrupted run -------------------

@pytest.mark.slow
def test_sigkill_mid_epoch_then_train_again_resumes_to_the_uninterrupted_result(tmp_path):
    whole = scratch_repo(tmp_path / "whole", RESUMABLE)
    run(["fasttrain", "download"], whole)
    run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], whole)

    killed = scratch_repo(tmp_path / "killed", RESUMABLE)
    run(["fasttrain", "download"], killed)
    # The run SIGKILLs itself at epoch 2, step 8 of 16 (the test hooks): mid-epoch however busy
    # the machine is.
    proc = subprocess.run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], cwd=killed,
                          env=hooked({**env(), "FASTTRAIN_FAULT_KILL_RANK_AT": "0:2:8"}), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == SIGKILLED, proc.stderr[-2000:]
    ckpt = checkpoint_file(killed, "single-fp32")
    done = checkpoint.load(ckpt)["state"]["epoch"]
    assert done == 1 and not (killed / "models" / "seed0" / "single-fp32.pt").exists()

    again = run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], killed)
    assert re.search(f"{resuming_from('single-fp32')} after epoch {done}", again.stderr), again.stderr
    assert f"epoch {done}/3" not in again.stderr and "epoch 3/3" in again.stderr

    assert_same_state(final_model(killed, "single-fp32"), final_model(whole, "single-fp32"))
    assert per_epoch(killed, "single-fp32") == per_epoch(whole, "single-fp32")
    a, b = train_metrics(killed, "single-fp32"), train_metrics(whole, "single-fp32")
    for key in ("epochs", "train_loss", "test_accuracy", "grad_scaler_skipped_steps"):
        assert a[key] == b[key], key
    assert len(a["epoch_seconds_each"]) == 3
    # (the optimizer and scheduler went on exactly where they stopped: equal weights after a whole epoch
    # of AdamW steps, and the per-epoch table's lr column). Neither run keeps a checkpoint once finished.
    assert not ckpt.exists() and not (whole / "checkpoints" / "single-fp32").exists()


# --- 2. An interrupted save leaves the previous checkpoint intact --------------------------------

def _checkpoint(marker: int, mb: int = 1) -> dict:
    return {"model": {"w": torch.full((mb * 2**18,), float(marker))}, "marker": marker}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "last.pt")


@pytest.mark.parametrize("fail_in", ["write", "fsync", "replace"])
def test_an_exception_inside_the_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, fail_in):
    path = tmp_path / "last.pt"
    checkpoint.save(_checkpoint(1), path)
    real_fdopen = os.fdopen

    class HalfWritten:  # writes half of what it is given, then the disk is full
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    target = {"write": ("fdopen", lambda *a, **k: HalfWritten(real_fdopen(*a, **k))),
              "fsync": ("fsync", boom), "replace": ("replace", boom)}[fail_in]
    monkeypatch.setattr(f"fasttrain.atomic.os.{target[0]}", target[1])
    with pytest.raises(DiskError, match="No space left"):
        checkpoint.save(_checkpoint(2), path)
    monkeypatch.undo()

    assert checkpoint.load(path)["marker"] == 1
    assert _leftovers(tmp_path) == []


_WRITER = textwrap.dedent("""
    import os, sys, time, torch
    from fasttrain import atomic, checkpoint
    path, mode = sys.argv[1], sys.argv[2]
    if mode == "half":  # stop for good half-way through writing the bytes, and say so
        real_fdopen = os.fdopen
        class Half:
            def __init__(self, f): self.f = f
            def __enter__(self): return self
            def __exit__(self, *exc): self.f.close()
            def fileno(self): return self.f.fileno()
            def write(self, data):
                self.f.write(data[: len(data) // 2]); self.f.flush()
                print("half written", flush=True)
                time.sleep(600)
        atomic.os.fdopen = lambda *a, **k: Half(real_fdopen(*a, **k))
        checkpoint.save({"model": {"w": torch.full((2**24,), 2.0)}, "marker": 2}, path)
    else:  # save big checkpoints back to back until killed, saying when each one is done
        for i in range(2, 10**6):
            checkpoint.save({"model": {"w": torch.full((2**25,), float(i))}, "marker": i}, path)
            print(f"saved {i}", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["half", "loop"])
def test_sigkill_during_a_save_keeps_the_previous_checkpoint(tmp_path, mode):
    """`half`: killed at a known point, half-way through the bytes: the previous checkpoint stays
    (a save written in place fails here, not in `loop`).
    `loop`: killed right after a stream of 128 MB saves has finished its second (marker 3), most
    likely while the writer builds the next tensor, before its file is opened: the last finished
    save is kept, or the next if it got as far as its rename, never an older one (a save that does
    not replace the file fails here). A temporary `.last.pt.*.tmp` may be left behind; the next save
    removes it."""
    path = tmp_path / "last.pt"
    checkpoint.save(_checkpoint(1), path)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), mode], stdout=subprocess.PIPE, text=True)
    if mode == "half":
        assert proc.stdout.readline().strip() == "half written"
    else:
        while (line := proc.stdout.readline().strip()) != "saved 3":
            assert line == "saved 2", line
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == SIGKILLED
    finished = [int(line.split()[1]) for line in proc.stdout.read().splitlines()] or [3]  # any said after "saved 3"

    saved = checkpoint.load(path)
    assert saved["marker"] == 1 if mode == "half" else saved["marker"] in (finished[-1], finished[-1] + 1)
    assert torch.equal(saved["model"]["w"], torch.full_like(saved["model"]["w"], float(saved["marker"])))
    left = _leftovers(tmp_path)
    assert all(n.startswith(".last.pt.") and n.endswith(".tmp") for n in left), left
    if mode == "half":
        assert len(left) == 1

    checkpoint.save(_checkpoint(3), path)
    assert checkpoint.load(path)["marker"] == 3
    assert _leftovers(tmp_path) == []


# --- NaN loss: stop naming epoch and step, keep the last good checkpoint ---------------------------

def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from fasttrain.data import make_synthetic, save_dataset

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    params = config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 3, "device": "cpu"}})
    real_step, steps = engine.train_step, []

    def poisoned(t, precision, x, y):
        loss, grad_norm = real_step(t, precision, x, y)
        steps.append(1)
        return (loss * float("nan") if len(steps) == 4 else loss), grad_norm  # epoch 2, step 2

    monkeypatch.setattr("fasttrain.train.train_step", poisoned)
    rt = parallel.setup("single", "cpu")
    with pytest.raises(FasttrainError, match=r"non-finite loss at epoch 2, step 2") as e:
        train(params, PRECISIONS["fp32"], rt, layout, log=lambda msg: None)
    assert "\n" not in str(e.value)
    assert checkpoint.load(checkpoint_of(layout, params))["state"]["epoch"] == 1
    assert not layout.model("single-fp32").exists()
    # the metrics hold the progress of the last good epoch (for dvc exp show), never a finished run's
    progress = json.loads(layout.train_metrics("single-fp32").read_text())
    assert progress["epochs"] == 1 and "images_per_second" not in progress


def test_checkpoints_every_n_epochs_none_after_the_last_and_a_crash_resumes_from_the_newest(tmp_path, monkeypatch):
    """checkpoint_every: 2 over 5 epochs writes after epochs 2 and 4, not after 5: the final model comes
    next, and the finished run's folder in checkpoints/ is removed. A crash in epoch 4 resumes after epoch
    2, names it, and ends with the uninterrupted run's weights; a NaN there names it too."""
    from fasttrain.data import make_synthetic, save_dataset

    params = config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 5, "device": "cpu"},
                               "run": {"checkpoint_every": 2}})
    rt = parallel.setup("single", "cpu")
    real_save, real_step = checkpoint.save, engine.train_step
    saved = []
    monkeypatch.setattr("fasttrain.train.checkpoint.save",
                        lambda obj, path, *what: (saved.append(obj.get("state", {}).get("epoch")),
                                                  real_save(obj, path, *what)))

    def run(root: Path, fail_at_step: int | None = None, nan: bool = False):
        layout = Layout(root)
        if not layout.dataset.exists():
            save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)  # 2 steps an epoch
        steps, logs = [], []

        def step(t, precision, x, y):
            steps.append(1)
            if len(steps) == fail_at_step:
                if not nan:
                    raise RuntimeError("crash")
                loss, grad_norm = real_step(t, precision, x, y)
                return loss * float("nan"), grad_norm
            return real_step(t, precision, x, y)

        monkeypatch.setattr("fasttrain.train.train_step", step)
        train(params, PRECISIONS["fp32"], rt, layout, log=logs.append)
        return layout, logs

    whole, _ = run(tmp_path / "whole")
    assert saved == [2, 4, None]  # None: the final model, which holds no training state
    assert not (whole.checkpoints / "single-fp32").exists()  # neither last.pt nor its TensorBoard copy

    saved.clear()
    with pytest.raises(RuntimeError, match="crash"):
        run(tmp_path / "crashed", fail_at_step=7)  # epoch 4, step 1
    assert saved == [2]
    layout, logs = run(tmp_path / "crashed")
    assert any("resuming from" in m and "after epoch 2" in m for m in logs), logs
    assert saved == [2, 4, None]
    assert not (layout.checkpoints / "single-fp32").exists()
    assert_same_state(final_model(whole.root, "single-fp32"), final_model(layout.root, "single-fp32"))

    with pytest.raises(FasttrainError, match=r"non-finite loss at epoch 2, step 1 \(1 step\(s\)\); "
                                             r"no checkpoint of this run was written yet"):
        run(tmp_path / "nan-early", fail_at_step=3, nan=True)
    with pytest.raises(FasttrainError, match=r"non-finite loss at epoch 4, step 1 .*last\.pt \(epoch 2\)$"):
        run(tmp_path / "nan-late", fail_at_step=7, nan=True)



def test_a_finished_run_removes_its_own_checkpoint_and_nothing_of_the_users(tmp_path, monkeypatch):
    """A run resumed from a checkpoint the user named elsewhere (--resume) finishes and leaves that
    file alone; it removes checkpoints/<variant>/last.pt, its TensorBoard copy and a save's leftover
    temporary file, but not the folder while a file of the user's is in it."""
    from fasttrain.data import make_synthetic, save_dataset

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)  # 2 steps an epoch
    params = config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 3, "device": "cpu"}})
    rt = parallel.setup("single", "cpu")
    real_step = crash_at(monkeypatch, 5)  # in epoch 3
    with pytest.raises(RuntimeError, match="crash"):
        train(params, PRECISIONS["fp32"], rt, layout, log=lambda msg: None)
    folder = checkpoint_of(layout, params).parent
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "tensorboard"]
    saved = tmp_path / "saved.pt"
    shutil.copy(folder / "last.pt", saved)
    (folder / ".last.pt.x1y2z3.tmp").write_bytes(b"a save killed mid-write")
    (folder / "notes.txt").write_text("the user's")

    monkeypatch.setattr("fasttrain.train.train_step", real_step)
    logs = []
    train(params, PRECISIONS["fp32"], rt, layout, log=logs.append, resume=saved)
    assert any(f"resuming from {saved} after epoch 2" in m for m in logs), logs
    assert layout.model("single-fp32").exists() and checkpoint.load(saved)["state"]["epoch"] == 2
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]

    (folder / "notes.txt").unlink()
    train(params, PRECISIONS["fp32"], rt, layout, log=lambda msg: None)  # measured again, not resumed
    assert not folder.exists() and saved.exists()

# --- 3. ddp under torchrun: a worker that dies is restarted and the run resumes --------------------

RESTARTABLE = {"train": {"epochs": 3, "device": "cpu", "nproc": 2}, "run": {"max_restarts": 1}}  # gloo, GPUs or not


@pytest.mark.slow
def test_ddp_worker_killed_once_is_restarted_and_the_run_completes(tmp_path, monkeypatch):
    repo = scratch_repo(tmp_path / "repo", RESTARTABLE)
    run(["fasttrain", "download"], repo)
    monkeypatch.setenv("FASTTRAIN_FAULT_KILL_RANK_AT", "1:2:2")  # rank 1 SIGKILLs itself at epoch 2, step 2, once
    done = run(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], repo, timeout=600)
    monkeypatch.delenv("FASTTRAIN_FAULT_KILL_RANK_AT")
    assert re.search(f"{resuming_from('ddp-fp32')} after epoch 1", done.stderr), done.stderr
    m = train_metrics(repo, "ddp-fp32")
    assert m["epochs"] == 3 and len(m["epoch_seconds_each"]) == 3 and m["world_size"] == 2
    assert [e for e, *_ in per_epoch(repo, "ddp-fp32")] == ["1", "2", "3"]

    # ... and to the same weights as a run nobody killed.
    whole = scratch_repo(tmp_path / "whole", RESTARTABLE)
    shutil.copytree(repo / "data", whole / "data")
    run(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], whole, timeout=600)
    assert_same_state(final_model(repo, "ddp-fp32"), final_model(whole, "ddp-fp32"))
    assert per_epoch(repo, "ddp-fp32") == per_epoch(whole, "ddp-fp32")


@pytest.mark.slow
def test_ddp_worker_that_dies_every_time_fails_the_run_once_restarts_are_used_up(tmp_path, monkeypatch):
    repo = scratch_repo(tmp_path / "repo", RESTARTABLE)
    run(["fasttrain", "download"], repo)
    monkeypatch.setenv("FASTTRAIN_FAULT_KILL_RANK_AT", "1:1:1:always")
    failed = run(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], repo, timeout=600, check=False)
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("fasttrain: error: ddp worker rank 1 failed") and "after 1 restart(s)" in last, last
    assert "failed (exitcode" not in failed.stderr and "closing signal" not in failed.stderr  # the one line says it
    assert not (repo / "models" / "seed0" / "ddp-fp32.pt").exists()
    assert not (repo / "metrics" / "train" / "seed0" / "ddp-fp32.json").exists()


# --- 4. Ctrl-C during `dvc repro`, then `dvc repro` again ------------------------------------------

@pytest.mark.slow
def test_sigint_during_dvc_repro_then_dvc_repro_again_completes(tmp_path):
    """Ctrl-C while the stage trains. "While" is an event, not a guess about speed: the epoch gate
    (hooks/sitecustomize.py) holds fasttrain after its first epoch, checkpoint written, until the
    SIGINT has come."""
    repo = scratch_repo(tmp_path / "repo", RESUMABLE)
    with epoch_gate() as (gate_env, server):
        # dvc runs the stage's command with `$SHELL -c`. bash execs a lone command, so the stage's exit
        # status is fasttrain's own; dash (/bin/sh where SHELL is unset) stays in between, gets the
        # SIGINT too and dies of it, and the stage reads "exited with -2" whatever fasttrain did.
        gated = {**env(), **gate_env, "SHELL": shutil.which("bash")}
        # A new session, so the SIGINT goes to dvc and its stage command together, as Ctrl-C would.
        proc = subprocess.Popen(["dvc", "repro", "train@single-fp32-0"], cwd=repo, env=gated, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=sigint_as_a_terminal_gives_it)
        conn, _ = server.accept()  # the first epoch has ended and fasttrain waits here
        with conn:
            assert conn.makefile().readline().split()[0] == "single-fp32" and checkpoint_file(repo, "single-fp32").exists()
            os.killpg(proc.pid, signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert "fasttrain: aborted" in out and "exited with 130" in out, out  # fasttrain itself got the Ctrl-C
    assert not (repo / "models" / "seed0" / "single-fp32.pt").exists()

    again = run(["dvc", "repro", "train@single-fp32-0"], repo)
    output = again.stdout + again.stderr
    assert re.search(resuming_from("single-fp32"), output), output
    assert train_metrics(repo, "single-fp32")["epochs"] == 3
    assert "Running stage" not in run(["dvc", "repro", "train@single-fp32-0"], repo).stdout


@pytest.mark.slow
def test_ctrl_c_on_a_ddp_run_stops_every_worker_without_a_traceback_and_the_run_resumes(tmp_path):
    repo = scratch_repo(tmp_path / "repo", RESUMABLE, {"train": {"nproc": 2}})
    run(["fasttrain", "download"], repo)
    with epoch_gate() as (gate_env, server):  # rank 0 waits after its first epoch, checkpoint written
        gated = {**env(), **gate_env}
        proc = subprocess.Popen(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], cwd=repo,
                                env=gated, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=sigint_as_a_terminal_gives_it)
        conn, _ = server.accept()
        with conn:
            assert conn.makefile().readline().split()[0] == "ddp-fp32" and checkpoint_file(repo, "ddp-fp32").exists()
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the launcher's process group (workers have their own)
            _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "fasttrain: aborted" and "Traceback" not in err, err
    # The launcher has exited; its workers may take a moment more to end, but not many.
    deadline = time.monotonic() + 10
    while (workers := subprocess.run(["pgrep", "-f", f"fasttrain train.*{repo}"], capture_output=True,
                                     text=True).stdout) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers == "", "ddp workers outlived the interrupted run by 10 s"

    again = run(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], repo, timeout=600)
    assert re.search(resuming_from("ddp-fp32"), again.stderr), again.stderr
    assert train_metrics(repo, "ddp-fp32")["epochs"] == 3


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # (state, ppid, ...)
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_ddp_workers_end_when_their_launcher_is_killed_with_sigkill(tmp_path):
    # `dvc queue stop --kill` or the OOM killer: the launcher gets no chance to stop its workers, and
    # its GPU lease ends with it. Many epochs: the workers would train on for minutes if not stopped.
    repo = scratch_repo(tmp_path / "repo", RESUMABLE, {"train": {"nproc": 2, "epochs": 200}})
    run(["fasttrain", "download"], repo)
    proc = subprocess.Popen(["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"], cwd=repo, env=env(),
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        wait_for(lambda: checkpoint_file(repo, "ddp-fp32").exists(), proc, what="the first epoch's checkpoint")  # the workers train
        workers = children(proc.pid)
        assert len(workers) == 2 and all(map(alive, workers)), workers
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(alive, workers)), "ddp workers outlived their SIGKILLed launcher"
    finally:
        for pid in children(proc.pid) + workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- 5. ddp evaluation counts every test image once, whatever the world size ------------------------

@pytest.mark.slow
def test_ddp_evaluation_is_identical_at_world_sizes_1_2_and_3(tmp_path):
    # 49 test images: divisible by neither 2 nor 3; batches of 8 leave ragged last batches. A barely
    # trained resnet18 spreads its predictions over several classes (a few CPU epochs from scratch do
    # not), with top-2 logit margins far above what batch composition changes in fp32.
    repo = scratch_repo(tmp_path / "repo", {"data": {"synthetic_test_size": 49, "synthetic_train_size": 64},
                                            "model": {"name": "resnet18"}, "train": {"lr": 1e-6, "device": "cpu"},
                                            "evaluate": {"batch_size": 8}})
    run(["fasttrain", "download"], repo)
    run(["fasttrain", "train", "--parallel", "single", "--precision", "fp32"], repo)
    shutil.copy(repo / "models" / "seed0" / "single-fp32.pt", repo / "models" / "seed0" / "ddp-fp32.pt")

    run(["fasttrain", "evaluate", "--parallel", "single", "--precision", "fp32"], repo)
    results = {1: record(repo, "single-fp32", "evaluate")}
    for nproc in (2, 3):
        set_params(repo, {"train": {"nproc": nproc}})
        run(["fasttrain", "evaluate", "--parallel", "ddp", "--precision", "fp32"], repo)
        results[nproc] = record(repo, "ddp-fp32", "evaluate")

    assert [r["world_size"] for r in results.values()] == [1, 2, 3]
    one = results[1]
    assert one["test_images"] == 49 and sum(map(sum, one["confusion_matrix"])) == 49
    assert sum(1 for col in zip(*one["confusion_matrix"]) if sum(col)) > 1, "a model that predicts one class"
    for r in results.values():
        assert r["test_images"] == 49
        assert r["confusion_matrix"] == one["confusion_matrix"]
        assert r["test_accuracy"] == one["test_accuracy"]
        assert r["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)


# --- 6. dp and ddp checkpoints are bare torchvision state_dicts -------------------------------------

@pytest.mark.slow
def test_dp_and_ddp_models_load_into_a_bare_torchvision_alexnet_strictly(tmp_path):
    repo = scratch_repo(tmp_path / "repo", {
        "data": {"synthetic_train_size": 16, "synthetic_test_size": 10},
        "model": {"name": "alexnet"}, "train": {"img_size": 63, "batch_size": 16, "epochs": 3},
    })
    run(["fasttrain", "download"], repo)
    for parallel_name in ("dp", "ddp"):
        cmd = ["fasttrain", "train", "--parallel", parallel_name, "--precision", "fp32"]
        # a SIGTERM in epoch 2 leaves a checkpoint (a finished run keeps none); the next run finishes
        stopped = run(cmd, repo, check=False, env={"FASTTRAIN_FAULT_SIGNAL_AT": "SIGTERM:0:2:1"})
        assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-2000:]
        last = checkpoint.load(checkpoint_file(repo, f"{parallel_name}-fp32"))["model"]
        run(cmd, repo)
        for state in (last, final_model(repo, f"{parallel_name}-fp32")):
            bare = torchvision.models.get_model("alexnet", weights=None, num_classes=10)
            assert bare.load_state_dict(state, strict=True).missing_keys == []


def test_a_run_of_other_params_starts_afresh_beside_an_unfinished_one_and_says_so(tmp_path, monkeypatch):
    """Checkpoints are keyed by the config's hash: a crashed run of lr 1e-3 keeps its folder while a
    run of lr 2e-3 trains from epoch 0 in its own, names the other and its size, and removes only its
    own at the end; lr 1e-3 again resumes its run. A checkpoint never crosses to another data set."""
    from fasttrain.data import make_synthetic, save_dataset

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)  # 2 steps an epoch
    first, other = (config.from_dict({**TINY, "train": {**TINY["train"], "epochs": 3, "lr": lr, "device": "cpu"}})
                    for lr in (1e-3, 2e-3))
    rt = parallel.setup("single", "cpu")
    real_step = crash_at(monkeypatch, 3)  # in epoch 2
    with pytest.raises(RuntimeError, match="crash"):
        train(first, PRECISIONS["fp32"], rt, layout, log=lambda msg: None)
    kept = checkpoint_of(layout, first)
    assert checkpoint.load(kept)["state"]["epoch"] == 1 and kept != checkpoint_of(layout, other)

    monkeypatch.setattr("fasttrain.train.train_step", real_step)
    logs = []
    train(other, PRECISIONS["fp32"], rt, layout, log=logs.append)
    assert not any("resuming" in m for m in logs), logs
    assert any(f"{kept.parent} is an unfinished run of other params" in m and " MB" in m for m in logs), logs
    assert kept.exists() and not checkpoint_of(layout, other).parent.exists()
    with pytest.raises(FasttrainError, match=r"is from another config \(hash [0-9a-f]{16}, now [0-9a-f]{16}\): "
                                             r"train\.lr: 0\.001 -> 0\.002; restore the params"):
        train(other, PRECISIONS["fp32"], rt, layout, log=lambda msg: None, resume=kept)  # named: what differs

    save_dataset(make_synthetic(64, 10, 32, 1), layout.dataset)  # another data set: another key
    assert checkpoint_of(layout, first) != kept
    save_dataset(make_synthetic(64, 10, 32, 0), layout.dataset)
    logs = []
    train(first, PRECISIONS["fp32"], rt, layout, log=logs.append)
    assert any(f"resuming from {kept} after epoch 1" in m for m in logs), logs
    assert not (layout.checkpoints / "single-fp32").exists()
