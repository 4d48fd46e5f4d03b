"""Two tiny variants through `dvc exp run --queue` and `dvc queue start -j 2`, as the README's
several-GPU recipe runs them: a running experiment shows its first epoch in `dvc exp show`, and
after the queue `dvc repro` restores both TensorBoard runs from the run-cache without training.

When a run's first epoch has ended it tells the test through a socket and waits for the test to
look (hooks/sitecustomize.py), so the check happens while it runs by construction.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from scratch import BIN, alive, checkpoint_file, epoch_gate, resuming_from, run, set_params, wait_until

from fasttrain import checkpoint

pytestmark = pytest.mark.slow

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
VARIANTS = ("single-fp32", "dp-fp32")  # dp without a GPU runs as one process: both cheap on 2 cores
EPOCHS, STEPS_PER_EPOCH = 2, 2  # 64 images in batches of 32


def running_metrics(exp_show: list, variant: str) -> list[dict]:
    """The train metrics of every running experiment in `dvc exp show --json`'s output."""
    found = []
    for baseline in exp_show:
        for exp_range in baseline.get("experiments") or []:
            if (exp_range.get("executor") or {}).get("state") != "running":
                continue
            for exp in exp_range["revs"]:
                metrics = ((exp.get("data") or {}).get("metrics") or {}).get(f"metrics/train/seed0/{variant}.json")
                if metrics and "data" in metrics:  # the other variant's run has an error here: no such file
                    found.append(metrics["data"])
    return found


def exp_show(repo, env: dict) -> list:
    """`dvc exp show --json`. Under a busy queue it can wait for ever on the queue's lock
    (.dvc/tmp/exps/rwlock.lock, DVC's issue 8762: only killing it frees the lock), so it gets 120 s
    a try and three tries; a run's live metrics are what this test is about, not that DVC race."""
    for attempt in range(3):
        try:
            return json.loads(run(["dvc", "exp", "show", "--json"], repo, env=env, timeout=120).stdout)
        except subprocess.TimeoutExpired:  # subprocess.run has killed it
            if attempt == 2:
                raise


def test_queued_runs_show_each_epoch_and_keep_their_tensorboard_runs(tiny_repo):
    set_params(tiny_repo, {"data": {"synthetic_train_size": 64}, "train": {"epochs": EPOCHS, "device": "cpu"}})
    run(["dvc", "repro", "download"], tiny_repo)
    run(["git", "add", "-A"], tiny_repo)
    run(["git", "commit", "-qm", "tiny params and the data set"], tiny_repo, env=GIT_ENV)

    # both experiments' dvc start-up and first epoch, on 2 busy cores
    with epoch_gate(backlog=2, timeout=600) as (gate_env, server):
        env = {**GIT_ENV, **gate_env}
        try:
            for variant in VARIANTS:
                run(["dvc", "exp", "run", "--queue", "-n", f"live-{variant}", f"train@{variant}-0"], tiny_repo, env=env)
            # its workers outlive it: their output goes to a file, or run() would wait for them
            with open(tiny_repo.parent / "queue-start.log", "w") as out:
                subprocess.run(["dvc", "queue", "start", "-j", "2"], cwd=tiny_repo, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, **env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
                               check=True, timeout=120)
            seen = set()
            for _ in VARIANTS:
                conn, _addr = server.accept()  # a run ended its first epoch and is waiting
                with conn:
                    conn.settimeout(60)
                    variant = conn.makefile().readline().split()[0]
                    shown = exp_show(tiny_repo, env)
                    found = running_metrics(shown, variant)
                    assert len(found) == 1, json.dumps(shown)[:4000]
                    metrics = found[0]
                    assert metrics["epochs"] == 1 and metrics["train_seconds"] > 0, metrics
                    assert metrics["train_loss"] > 0 and 0 <= metrics["test_accuracy"] <= 1, metrics
                    conn.sendall(b"go")
                seen.add(variant)
            assert seen == set(VARIANTS)
            for variant in VARIANTS:  # follows the log until the experiment ends
                run(["dvc", "queue", "logs", "-f", f"live-{variant}"], tiny_repo, env=env, timeout=600)
        finally:
            run(["dvc", "queue", "kill", "--force", *(f"live-{v}" for v in VARIANTS)], tiny_repo, check=False)
            run(["dvc", "queue", "stop", "--kill"], tiny_repo, check=False)
    status = run(["dvc", "queue", "status"], tiny_repo).stdout
    assert status.count("Success") == len(VARIANTS), status

    # The queue's temporary workspaces are gone; the workspace's dvc repro restores, trains nothing.
    restored = run(["dvc", "repro", *(f"train@{v}-0" for v in VARIANTS)], tiny_repo).stdout
    assert "Running stage 'train@" not in restored, restored
    for variant in VARIANTS:
        acc = EventAccumulator(str(tiny_repo / "tensorboard" / "seed0" / variant))
        acc.Reload()
        assert [e.step for e in acc.Scalars("epoch/train_loss")] == list(range(1, EPOCHS + 1)), variant
        assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), variant
        final = json.loads((tiny_repo / "metrics" / "train" / "seed0" / f"{variant}.json").read_text())
        assert final["epochs"] == EPOCHS and "images_per_second" in final  # the whole set, not the progress


def queue_start(repo, env: dict, log_name: str) -> None:
    """`dvc queue start`: its worker outlives it, so its output goes to a file, or run() would wait."""
    with open(repo.parent / log_name, "w") as out:
        subprocess.run(["dvc", "queue", "start"], cwd=repo, stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, **env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
                       check=True, timeout=120)


def wait_for_the_workers_to_end(repo, timeout: float = 120) -> None:
    """A queue's worker ends once its queue has stayed empty for 10 s (dvc_task's TemporaryWorker
    looks every 10 s). A task queued about then can be left reported Running for ever, with no
    worker to run it: `dvc queue start` starts none while the old one is still there. So a test
    that queues again waits for the worker to end first."""
    for pid_file in (repo / ".dvc" / "tmp" / "exps" / "celery").glob("dvc-exp-worker-*.pid"):
        pid = int(pid_file.read_text())
        wait_until(lambda: not _a_queue_worker(pid), f"the queue's worker {pid} to end", timeout, every=0.5)


def _a_queue_worker(pid: int) -> bool:
    try:
        return alive(pid) and b"queue-worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has just ended
        return False


def task_status(repo, name: str, env: dict, timeout: float = 300) -> str:
    """The queued experiment's status once it has ended. `dvc queue logs -f` is no wait for that: it
    can return while the queue still records the task as running, and it refuses a task that no
    worker has started yet."""
    deadline = time.monotonic() + timeout
    while True:
        status = run(["dvc", "queue", "status"], repo, env=env).stdout
        line = next((line.split() for line in status.splitlines() if f" {name} " in f" {line} "), [])
        if line and line[-1] in ("Success", "Failed"):
            return line[-1]
        assert time.monotonic() < deadline, status
        time.sleep(1)


def test_a_preempted_queued_experiment_queued_again_resumes_from_its_checkpoint(tiny_repo):
    """A queued run trains in a temporary copy of the repository, gone when it ends. SIGTERM after its
    first epoch: it checkpoints and exits 75, and its checkpoint stays in the repository's own
    checkpoints/ (DVC_ROOT), keyed by the config's hash. The same experiment queued again resumes
    there after epoch 1, not from epoch 0, and once finished leaves no checkpoint behind."""
    set_params(tiny_repo, {"data": {"synthetic_train_size": 64}, "train": {"epochs": 3, "device": "cpu"}})
    run(["dvc", "repro", "download"], tiny_repo)
    run(["git", "add", "-A"], tiny_repo)
    run(["git", "commit", "-qm", "tiny params and the data set"], tiny_repo, env=GIT_ENV)
    try:
        with epoch_gate(timeout=600) as (gate_env, server):
            env = {**GIT_ENV, **gate_env}
            run(["dvc", "exp", "run", "--queue", "-n", "stopped", "train@single-fp32-0"], tiny_repo, env=env)
            queue_start(tiny_repo, env, "queue-stopped.log")
            conn, _addr = server.accept()  # its first epoch and checkpoint are done; it waits
            with conn:
                conn.settimeout(60)
                variant, pid = conn.makefile().readline().split()
                assert variant == "single-fp32"
                os.kill(int(pid), signal.SIGTERM)  # as a scheduler's preemption would
                conn.sendall(b"go")
            stopped = run(["dvc", "queue", "logs", "-f", "stopped"], tiny_repo, env=env, timeout=600).stdout
        assert "queue the experiment again with the same params to resume (exit 75)" in stopped, stopped
        assert task_status(tiny_repo, "stopped", GIT_ENV) == "Failed"
        saved = checkpoint_file(tiny_repo, "single-fp32")
        assert checkpoint.load(saved)["state"]["epoch"] == 1  # in the repository, not the gone workspace

        wait_for_the_workers_to_end(tiny_repo)
        run(["dvc", "exp", "run", "--queue", "-n", "again", "train@single-fp32-0"], tiny_repo, env=GIT_ENV)
        queue_start(tiny_repo, GIT_ENV, "queue-again.log")
        status = task_status(tiny_repo, "again", GIT_ENV, timeout=600)  # (logs -f refuses a task not yet started)
        again = run(["dvc", "queue", "logs", "again"], tiny_repo, env=GIT_ENV).stdout
        assert status == "Success", again
    finally:
        run(["dvc", "queue", "stop", "--kill"], tiny_repo, check=False)
    assert re.search(rf"{resuming_from('single-fp32')} after epoch 1\b", again), again
    assert f"resuming from {saved}" in again and "epoch 1/3" not in again and "epoch 3/3" in again, again
    shown = exp_show(tiny_repo, GIT_ENV)
    (finished,) = [exp["data"] for baseline in shown for exp_range in baseline.get("experiments") or []
                   for exp in exp_range["revs"] if exp.get("name") == "again"]
    assert finished["metrics"]["metrics/train/seed0/single-fp32.json"]["data"]["epochs"] == 3
    assert not (tiny_repo / "checkpoints" / "single-fp32").exists()  # finished: its checkpoint is gone
