"""A scratch copy of the repository, and running commands in it, for end-to-end tests."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOOKS = Path(__file__).parent / "hooks"  # the test hooks: the epoch gate, faults at a step (hooks/sitecustomize.py)
HOOK_VARIABLES = ("FASTTRAIN_TEST_EPOCH_SOCKET", "FASTTRAIN_FAULT_KILL_RANK_AT", "FASTTRAIN_FAULT_SIGNAL_AT",
                  "FASTTRAIN_TEST_HOLD_IMPORT", "FASTTRAIN_TEST_SLOW_EXIT")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, check=True, capture_output=True).stdout
    return [f for f in out.decode().split("\0") if f and (REPO / f).exists()]


def copy_repo(dest: Path) -> Path:
    """A scratch copy of the repository as a user would clone it: tracked files only, its own git."""
    for f in tracked_files():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(["git", "commit", "-qm", "copy"], cwd=dest, check=True, env=env)
    return dest


def record(repo: Path, variant: str, stage: str = "train", seed: int = 0) -> dict:
    """A stage's whole record of one variant's run of `seed`: its headline metrics and its diagnostics,
    as one dict."""
    kind = {"train": "train", "evaluate": "eval"}[stage]
    metrics, diagnostics = (json.loads((repo / top / kind / f"seed{seed}" / f"{variant}.json").read_text())
                            for top in ("metrics", "diagnostics"))
    assert not metrics.keys() & diagnostics.keys(), "a figure in both files"
    return {**diagnostics, **metrics}


def checkpoint_file(repo: Path, variant: str) -> Path:
    """The variant's unfinished run's checkpoint, checkpoints/<variant>/<config hash>/last.pt (the
    one run of it there, as the tests make them); a path that does not exist while there is none."""
    found = sorted((repo / "checkpoints" / variant).glob("*/last.pt"))
    assert len(found) <= 1, found
    return found[0] if found else repo / "checkpoints" / variant / "(none)" / "last.pt"


def checkpoint_of(layout, params, variant: str = "single-fp32", world_size: int = 1) -> Path:
    """Where a run of `params` in `layout` (its data set written) keeps its checkpoint: before it runs."""
    from fasttrain import config
    from fasttrain.data import load_dataset
    from fasttrain.train import resolved_config

    parallel_name, precision_name = variant.split("-")
    resolved = resolved_config(params, parallel_name, precision_name, world_size, load_dataset(layout.dataset))
    return layout.checkpoint_dir(variant, config.config_hash(resolved)) / "last.pt"


# what train prints when it resumes: the folder keyed by the config's hash, absolute under DVC (DVC_ROOT)
def resuming_from(variant: str) -> str:
    return rf"resuming from \S*checkpoints/{variant}/[0-9a-f]{{16}}/last\.pt"


def set_params(repo: Path, overrides: dict) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for section, values in overrides.items():
        params.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def stages_run(output: str) -> list[str]:
    """The stages a `dvc repro` or `dvc exp run` ran, by its "Running stage '...'" lines, sorted."""
    return sorted(line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage"))


def hooked(env: dict[str, str]) -> dict[str, str]:
    """`env` with the test hooks' folder first on PYTHONPATH where it asks for a hook (HOOK_VARIABLES):
    only then does a fasttrain process carry them."""
    if not any(env.get(name) for name in HOOK_VARIABLES):
        return env
    return {**env, "PYTHONPATH": os.pathsep.join([str(HOOKS), env.get("PYTHONPATH", "")])}


def run(cmd: list[str], cwd: Path, timeout: float = 900, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`cmd` with this Python's scripts first on PATH (and `env` added to the environment, with the
    test hooks it asks for: hooked)."""
    env = hooked({**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1", **(env or {})})
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


# Tiny, but every stage and variant real: squeezenet1_1 is the fastest torchvision model at 32 px on
# a CPU without native fp16, where half precision runs 10-50x slower than fp32.
TINY = {
    "data": {"source": "synthetic", "synthetic_train_size": 128, "synthetic_test_size": 50,
             "loader": "gpu", "workers": 0, "pin_memory": False},
    "model": {"name": "squeezenet1_1"},
    "train": {"epochs": 1, "batch_size": 32, "lr": 1e-3, "img_size": 32, "scheduler": "none"},
    "evaluate": {"batch_size": 50},
    "run": {"log_every_steps": 1, "checkpoint_every": 1},
}




@contextlib.contextmanager
def epoch_gate(backlog: int = 1, timeout: float = 300):
    """(env, listening socket). Every `fasttrain train` started with `env` added to its environment,
    however DVC starts it, reports the end of its first epoch on the socket (rank 0, after the
    checkpoint) and waits there until the test answers or signals it (hooks/sitecustomize.py),
    so "while it runs" is an event, not a guess about timing. `timeout`: for the socket's accept."""
    sock_dir = Path(tempfile.mkdtemp(prefix="ft-gate-"))  # AF_UNIX paths are limited to ~100 bytes
    env = hooked({"FASTTRAIN_TEST_EPOCH_SOCKET": str(sock_dir / "epoch.sock"),
                  "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])})
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(env["FASTTRAIN_TEST_EPOCH_SOCKET"])
            server.listen(backlog)
            server.settimeout(timeout)
            yield env, server
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def alive(pid: int) -> bool:
    """Running, not ended (a zombie nobody has reaped yet counts as ended)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, what: str, timeout: float = 120, every: float = 0.05) -> None:
    """Polls `condition` until it holds; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(every)
