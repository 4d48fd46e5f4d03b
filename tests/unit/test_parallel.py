"""Runtime decisions of fasttrain.parallel that need no GPU to check."""

import pytest
import torch

from fasttrain.parallel import Runtime

CUDA0 = torch.device("cuda", 0)


# --- several nodes: where a worker sits, and the per-node GPU check ------------------------------

from fasttrain import parallel  # noqa: E402
from fasttrain.errors import FasttrainError  # noqa: E402

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_JOB_ID")


@pytest.fixture
def clean_env(monkeypatch):
    for name in TORCHRUN_VARS + SLURM_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def torchrun_env(mp, rank: int, local_rank: int, world_size: int, local_world_size: int) -> None:
    for name, value in zip(TORCHRUN_VARS[:4], (rank, local_rank, world_size, local_world_size)):
        mp.setenv(name, str(value))


def fake_gpus(mp, count: int) -> list:
    """`count` visible GPUs, and a process group that records its arguments instead of starting."""
    calls = []
    mp.setattr(torch.cuda, "is_available", lambda: count > 0)
    mp.setattr(torch.cuda, "device_count", lambda: count)
    mp.setattr(torch.cuda, "set_device", lambda dev: None)
    mp.setattr(parallel.dist, "is_initialized", lambda: False)
    mp.setattr(parallel.dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    return calls


@pytest.mark.parametrize("rank, local_rank", [(0, 0), (1, 1), (2, 0), (3, 1)])
def test_two_nodes_of_two_processes_on_two_gpus_each_pass_the_per_node_check(clean_env, rank, local_rank):
    calls = fake_gpus(clean_env, 2)
    torchrun_env(clean_env, rank, local_rank, world_size=4, local_world_size=2)
    rt = parallel.setup("ddp", "cuda")
    assert (rt.rank, rt.local_rank, rt.world_size, rt.device) == (rank, local_rank, 4, torch.device("cuda", local_rank))
    (backend, kw), = calls
    assert backend == "nccl" and kw["rank"] == rank and kw["world_size"] == 4


def test_three_processes_on_a_two_gpu_node_are_refused_naming_the_node_and_the_flag(clean_env):
    fake_gpus(clean_env, 2)
    torchrun_env(clean_env, rank=2, local_rank=2, world_size=6, local_world_size=3)
    with pytest.raises(FasttrainError) as e:
        parallel.setup("ddp", "cuda")
    assert str(e.value) == ("3 ddp processes on this node (local rank 2) but only 2 GPU(s) visible here: "
                            "start at most 2 per node with --nproc-per-node (train.nproc)")


def test_a_batch_scripts_slurm_variables_make_no_worker_but_an_srun_steps_do(clean_env):
    # sbatch's own environment (where `dvc repro` runs): one process that must start the workers.
    for name, value in (("SLURM_JOB_ID", "7"), ("SLURM_NTASKS", "16"), ("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")):
        clean_env.setenv(name, value)
    assert parallel.placement() is None
    # A task of `srun --nodes 3 --ntasks-per-node 2` (uneven: 2, 2, 1), on the third node.
    for name, value in (("SLURM_STEP_NUM_TASKS", "5"), ("SLURM_PROCID", "4"), ("SLURM_LOCALID", "0"),
                        ("SLURM_NODEID", "2"), ("SLURM_STEP_TASKS_PER_NODE", "2(x2),1")):
        clean_env.setenv(name, value)
    assert parallel.placement() == parallel.Placement(4, 0, 5, 1, "srun")
    torchrun_env(clean_env, 1, 1, 2, 2)  # torchrun started from srun, one per node: torchrun's say
    assert parallel.placement() == parallel.Placement(1, 1, 2, 2, "torchrun")


def test_srun_tasks_find_the_master_from_the_environment_or_the_job(clean_env):
    clean_env.setenv("SLURM_JOB_ID", "123456")
    clean_env.setenv("MASTER_ADDR", "node7")
    assert parallel.slurm_master() == ("node7", str(20000 + 123456 % 20000))
    clean_env.setenv("MASTER_PORT", "29400")
    assert parallel.slurm_master() == ("node7", "29400")


@pytest.mark.parametrize("raw", ["0", "-5", "soon", ""])
def test_a_bad_dist_timeout_is_one_line_naming_the_variable(clean_env, raw):
    clean_env.setenv("FASTTRAIN_DIST_TIMEOUT", raw)
    with pytest.raises(FasttrainError, match=r"^FASTTRAIN_DIST_TIMEOUT = .* is not a number of seconds > 0"):
        parallel.dist_timeout()


@pytest.mark.parametrize("raw", [None, "node0", "node0:", ":29500"])
def test_train_nnodes_without_a_rendezvous_endpoint_is_one_line(clean_env, raw):
    if raw is None:
        clean_env.delenv("FASTTRAIN_RDZV_ENDPOINT", raising=False)
    else:
        clean_env.setenv("FASTTRAIN_RDZV_ENDPOINT", raw)
    with pytest.raises(FasttrainError, match=r"^train.nnodes > 1 needs FASTTRAIN_RDZV_ENDPOINT=HOST:PORT"):
        parallel.launch(["train"], nproc=1, device="cpu", nnodes=2)


# --- dp's replica threads --------------------------------------------------------------------

class _Probe(torch.nn.Module):
    """Records the thread each call runs in; `fail` raises inside the replica."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.threads, self.fail = [], fail

    def forward(self, x):
        import threading
        self.threads.append(threading.get_ident())
        if self.fail:
            raise ValueError("replica failed")
        return x * self.weight


def test_replica_threads_run_each_replica_in_the_same_thread_every_step_in_the_callers_grad_mode():
    import threading

    from fasttrain.parallel import ReplicaThreads

    threads = ReplicaThreads(2)
    a, b = _Probe(), _Probe()
    for step in range(3):
        out = threads.run([a, b], [(torch.tensor(1.0),), torch.tensor(2.0)], [{}, {}], [None, None])
        assert [float(o.detach()) for o in out] == [1.0, 2.0] and all(o.requires_grad for o in out)
    with torch.no_grad():
        out = threads.run([a, b], [(torch.tensor(1.0),), (torch.tensor(2.0),)], [{}, {}], [None, None])
    assert not any(o.requires_grad for o in out)
    assert len(set(a.threads)) == 1 and len(set(b.threads)) == 1  # one thread each, all four steps
    assert a.threads[0] != b.threads[0] and threading.get_ident() not in a.threads + b.threads


def test_a_failing_replica_raises_in_the_caller():
    from fasttrain.parallel import ReplicaThreads

    with pytest.raises(ValueError, match="replica failed"):
        ReplicaThreads(2).run([_Probe(), _Probe(fail=True)], [(torch.tensor(1.0),)] * 2, [{}, {}], [None, None])


def _failure(exitcode: int, timestamp: int):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    f = ProcessFailure(local_rank=0, pid=1, exitcode=exitcode, error_file="/nonexistent")
    f.timestamp = timestamp  # torchrun's: whole seconds, taken when it saw the process end
    return f


@pytest.mark.parametrize("failures, named", [
    ({0: (76, 100), 1: (-9, 100)}, 1),  # rank 1 killed, rank 0 lost it in the same second: rank 1
    ({0: (76, 99), 1: (-9, 100)}, 1),  # even when the lost peer was seen a second earlier
    ({0: (1, 100), 1: (1, 101)}, 0),  # two failures of their own: the earlier
    ({0: (1, 100), 1: (1, 100)}, 0),  # a tie: the lower rank
    ({0: (76, 100), 1: (76, 100)}, 0),  # only lost peers (a node died): the earliest of them
    ({0: (-15, 100), 1: (-9, 100)}, 1),  # rank 1 killed, rank 0 stopped by torchrun in the same second
    ({0: (-15, 100), 1: (76, 100), 2: (1, 101)}, 2),  # stopped and lost ranks yield to one that failed
    ({0: (-15, 100), 1: (-15, 101)}, 0),  # only SIGTERMs (the workers were stopped): the earliest
])
def test_the_launcher_names_the_rank_that_failed_on_its_own_not_one_that_lost_it(failures, named):
    from fasttrain.errors import PeersLost

    assert PeersLost.exit_status == 76
    rank, failure = parallel.root_failure({r: _failure(*f) for r, f in failures.items()})
    assert rank == named and failure.exitcode == failures[named][0]


def test_every_parallel_mode_is_an_entry_of_one_table_in_the_variant_matrixs_order():
    from fasttrain.layout import PARALLELS
    from fasttrain.parallel import MODES

    assert tuple(MODES) == PARALLELS
    assert {m.name for m in MODES.values() if m.processes} == {"ddp"}  # only ddp is launched by torchrun
    assert {m.name for m in MODES.values() if m.not_capturable} == {"dp"}
    model = torch.nn.Linear(2, 2)
    for mode in MODES.values():  # on the CPU every mode's inference model is the model itself
        rt = Runtime(mode.name, torch.device("cpu"))
        assert rt.mode is mode and rt.distributed is mode.processes
        assert mode.wrap_for_inference(model, rt) is model
        if not mode.processes:  # one process holds every replica's state (ddp's: test_same_results, test_resume)
            assert mode.all_ranks({"rng": 1}, rt) == [{"rng": 1}]


def test_no_code_outside_parallel_py_compares_a_parallel_modes_name():
    """A new mode is an entry in parallel.MODES (and its name in layout.PARALLELS, the variant matrix):
    code that compared a name with "ddp" or "dp" would silently treat the new mode as neither."""
    import ast
    from pathlib import Path

    import fasttrain
    from fasttrain.parallel import MODES

    found = []
    for path in sorted(Path(fasttrain.__file__).parent.glob("*.py")):
        if path.name == "parallel.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n.value for n in (node.left, *node.comparators) if isinstance(n, ast.Constant)]
                elements = [e.value for n in node.comparators if isinstance(n, (ast.Tuple, ast.List, ast.Set))
                            for e in n.elts if isinstance(e, ast.Constant)]
                if set(names + elements) & set(MODES):
                    found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith"):
                if any(isinstance(a, ast.Constant) and a.value in MODES for a in node.args):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []
