"""ddp over several nodes, on one machine: each "node" is its own launcher
process (torchrun agent, fasttrain launcher or faked srun) on 127.0.0.1, one gloo worker each.

Ports come from the OS; FASTTRAIN_DIST_TIMEOUT keeps every wait short.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from scratch import BIN, TINY, checkpoint_file, copy_repo, record, resuming_from, run, set_params

CPU = {"train": {"device": "cpu", "nproc": 1}}  # one gloo process per node: two nodes make world size 2
TRAIN = ["fasttrain", "train", "--parallel", "ddp", "--precision", "fp32"]
TIMEOUT = "20"  # FASTTRAIN_DIST_TIMEOUT in seconds: how long a node waits for the others
# Bit-identical CPU results need the same intra-op threads in every run (a convolution sums in another
# order on 2 threads than on 1), whichever launcher starts the workers and however many per node.
THREADS = {"OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
            "FASTTRAIN_DIST_TIMEOUT": TIMEOUT, **THREADS, **extra}


def scratch_repo(path: Path, *overrides: dict) -> Path:
    repo = copy_repo(path)
    for o in (TINY, CPU, *overrides):
        set_params(repo, o)
    return repo


def start(cmd: list[str], repo: Path, log: Path, **extra) -> subprocess.Popen:
    """One node: its own session, so killing its process group kills the whole node."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=repo, env=env(**extra), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until node 0 hosts the rendezvous: node 1 must join, not host it (as on two real machines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"node 0 ended ({proc.returncode}) before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("node 0 never listened")


def nodes(cmd: list[str], repos: list[Path], tmp: Path, **extra) -> list[subprocess.Popen]:
    """The same command on every node, node 0 first, joined at one rendezvous endpoint."""
    port = free_port()
    procs = []
    for i, repo in enumerate(repos):
        procs.append(start([c.replace("PORT", str(port)) for c in cmd], repo, tmp / f"node{i}.log",
                           FASTTRAIN_RDZV_ENDPOINT=f"127.0.0.1:{port}", **extra))
        if i == 0:
            wait_listening(port, procs[0])
    return procs


def finish(procs: list[subprocess.Popen], tmp: Path, timeout: float = 600) -> list[str]:
    logs = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        logs.append((tmp / f"node{i}.log").read_text())
    return logs


def model(repo: Path, variant: str = "ddp-fp32") -> dict:
    return torch.load(repo / "models" / "seed0" / f"{variant}.pt", weights_only=True)["model"]


def assert_equal_models(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def metrics(repo: Path, kind: str = "train") -> dict:
    return record(repo, "ddp-fp32", {"train": "train", "eval": "evaluate"}[kind])


def error_lines(log: str) -> list[str]:
    """fasttrain's one-line endings: an error, or a stop after a checkpoint (exit 75)."""
    return [line for line in log.splitlines() if line.startswith(("fasttrain: error:", "fasttrain: stopped:"))]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory) -> Path:
    """The reference: one node, 2 processes (fasttrain's own torchrun --standalone)."""
    repo = scratch_repo(tmp_path_factory.mktemp("one") / "repo", {"train": {"nproc": 2}})
    run(["fasttrain", "download"], repo)
    run(TRAIN, repo, env={"FASTTRAIN_DIST_TIMEOUT": TIMEOUT, **THREADS})
    return repo


# --- 1. Two torchrun agents, one process each = one agent with two --------------------------------

@pytest.mark.slow
def test_two_torchrun_agents_train_the_same_model_as_one_agent_with_two_processes(one_node, tmp_path):
    repo = scratch_repo(tmp_path / "repo")
    shutil.copytree(one_node / "data", repo / "data")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:PORT", "--rdzv-id", "t1",
                "-m", "fasttrain"]
    logs = finish(nodes([*torchrun, *TRAIN[1:]], [repo, repo], tmp_path), tmp_path)
    assert all("Traceback" not in log for log in logs), logs
    assert_equal_models(model(repo), model(one_node))
    assert metrics(repo)["world_size"] == 2 and metrics(repo)["test_accuracy"] == \
        metrics(one_node)["test_accuracy"]

    # Evaluation over the two agents counts each of the 50 test images once.
    finish(nodes([*torchrun, "evaluate", *TRAIN[2:]], [repo, repo], tmp_path), tmp_path)
    ev = metrics(repo, "eval")
    assert ev["world_size"] == 2 and ev["test_images"] == 50 == sum(map(sum, ev["confusion_matrix"]))
    assert ev["test_accuracy"] == metrics(one_node)["test_accuracy"]


@pytest.mark.slow
def test_the_stage_with_train_nnodes_2_on_two_nodes_trains_the_same_model(one_node, tmp_path):
    """`fasttrain train` (what the dvc stage runs) with train.nnodes: 2 on both nodes."""
    repo = scratch_repo(tmp_path / "repo", {"train": {"nnodes": 2}})
    shutil.copytree(one_node / "data", repo / "data")
    logs = finish(nodes(TRAIN, [repo, repo], tmp_path), tmp_path)
    assert "Traceback" not in logs[0] + logs[1], logs
    assert_equal_models(model(repo), model(one_node))
    assert metrics(repo)["world_size"] == 2


# --- 2. SLURM: `dvc repro`'s `fasttrain train` in an allocation starts srun; tasks map SLURM_* -----

FAKE_SRUN = textwrap.dedent("""\
    #!{python}
    # srun on one machine: --nodes x --ntasks-per-node tasks of the command, each with the variables
    # a real srun step gives its tasks (tasks of "node" i share SLURM_NODEID i).
    import os, subprocess, sys
    args = sys.argv[1:]
    opts = {{}}
    while args[0].startswith("--"):
        key, _, value = args.pop(0)[2:].partition("=")
        opts[key] = value
    nodes, per_node = int(opts["nodes"]), int(opts["ntasks-per-node"])
    procs = []
    for node in range(nodes):
        for local in range(per_node):
            env = {{**os.environ, "SLURM_STEP_NUM_TASKS": str(nodes * per_node), "SLURM_PROCID": str(node * per_node + local),
                   "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node), "SLURM_STEP_TASKS_PER_NODE": f"{{per_node}}(x{{nodes}})",
                   "SLURM_STEP_NODELIST": "localhost"}}
            procs.append(subprocess.Popen(args, env=env))
    sys.exit(max(p.wait() for p in procs))
""")


@pytest.mark.slow
def test_srun_in_a_slurm_allocation_trains_the_same_model(one_node, tmp_path):
    repo = scratch_repo(tmp_path / "repo", {"train": {"nnodes": 2}})
    shutil.copytree(one_node / "data", repo / "data")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (fake / "srun").chmod(0o755)
    # The batch script's own environment: SLURM_NTASKS and SLURM_PROCID are there too, and must not
    # make the launcher think it is a worker.
    batch = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             "PATH": f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = run(TRAIN, repo, env={"FASTTRAIN_DIST_TIMEOUT": TIMEOUT, **THREADS, **batch}, timeout=600)
    assert "Traceback" not in done.stderr
    assert_equal_models(model(repo), model(one_node))
    assert metrics(repo)["world_size"] == 2


# --- 3. A node that dies ---------------------------------------------------------------------------

LONGER = {"data": {"synthetic_train_size": 512}, "train": {"epochs": 3, "nnodes": 2}}  # 16 steps an epoch


def wait_for(repo: Path, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    """Until the ddp-fp32 run in `repo` has written its first checkpoint."""
    deadline = time.monotonic() + timeout
    while not checkpoint_file(repo, "ddp-fp32").exists():
        assert all(p.poll() is None for p in procs), "a node ended early"
        assert time.monotonic() < deadline, f"no checkpoint in {repo / 'checkpoints'}"
        time.sleep(0.01)


def kill_node(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_node_1_killed_mid_epoch_ends_node_0_with_one_line_within_the_timeout(tmp_path):
    repo = scratch_repo(tmp_path / "repo", LONGER)
    run(["fasttrain", "download"], repo)
    procs = nodes(TRAIN, [repo, repo], tmp_path)
    wait_for(repo, procs)  # epoch 1 done: now in epoch 2
    kill_node(procs[1])
    killed = time.monotonic()
    log = finish(procs[:1], tmp_path, timeout=120)[0]
    seconds = time.monotonic() - killed
    # non-zero: 1 for the lost peer, or 75 when node 0's agent stopped its worker first (a checkpoint)
    assert procs[0].returncode in (1, 75), log
    assert seconds < 2 * int(TIMEOUT) + 40, seconds  # a lost peer, then the agent's own wait, on a busy machine
    assert "Traceback" not in log, log
    errors = error_lines(log)
    assert errors and log.strip().splitlines()[-1] == errors[-1], log
    assert not (repo / "models" / "seed0" / "ddp-fp32.pt").exists()


@pytest.mark.slow
def test_with_max_restarts_1_a_killed_node_started_again_resumes_from_the_checkpoint(tmp_path):
    repo = scratch_repo(tmp_path / "repo", LONGER, {"run": {"max_restarts": 1}})
    run(["fasttrain", "download"], repo)
    port = free_port()
    endpoint = {"FASTTRAIN_RDZV_ENDPOINT": f"127.0.0.1:{port}"}
    node0 = start(TRAIN, repo, tmp_path / "node0.log", **endpoint)
    wait_listening(port, node0)
    node1 = start(TRAIN, repo, tmp_path / "node1.log", **endpoint)
    wait_for(repo, [node0, node1])
    kill_node(node1)
    node1 = start(TRAIN, repo, tmp_path / "node1-again.log", **endpoint)  # the replacement node
    for p in (node0, node1):
        p.wait(timeout=600)
    log0 = (tmp_path / "node0.log").read_text()
    assert node0.returncode == 0 and node1.returncode == 0, log0
    assert re.search(f"{resuming_from('ddp-fp32')} after epoch 1", log0), log0
    m = metrics(repo)
    assert m["epochs"] == 3 and m["world_size"] == 2


# --- 4. A node with another data set ----------------------------------------------------------------

@pytest.mark.slow
def test_a_node_with_a_different_dataset_is_refused_on_every_rank(tmp_path):
    repos = [scratch_repo(tmp_path / f"node{i}", {"train": {"nnodes": 2}},
                          {"data": {"synthetic_seed": i}}) for i in range(2)]
    for repo in repos:
        run(["fasttrain", "download"], repo)
    procs = nodes(TRAIN, repos, tmp_path)
    logs = finish(procs, tmp_path, timeout=300)
    for p, log in zip(procs, logs):
        assert p.returncode == 1, log
        assert "Traceback" not in log, log
        worker_error = next(line for line in error_lines(log) if "is not the same on every node" in line)
        assert "data/dataset.pt" in worker_error and "rank(s) 0@" in worker_error and "rank(s) 1@" in worker_error
    assert not any((r / "models" / "seed0" / "ddp-fp32.pt").exists() for r in repos)
