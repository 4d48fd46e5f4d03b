"""Parallelism in one place: launch, set up, wrap, unwrap, reduce, tear down, "am I the main process".

The parallel modes are a table, `MODES`, as precision's are (precision.PRECISIONS): each entry says
whether it runs several processes, how it sets up, wraps a model for training and for inference,
gathers every rank's part of the saved state, and whether its step can be captured. Outside this
module no code compares a mode's name: it asks the entry (`Runtime.mode`, `MODES[name]`).

Only this module reads RANK / LOCAL_RANK / WORLD_SIZE (or SLURM_PROCID / SLURM_LOCALID / ... under
srun). The training loop receives a Runtime and a wrapped model and never asks which variant it runs.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from fasttrain import lease, server
from fasttrain.errors import FasttrainError, PeersLost, Preempted
from fasttrain.layout import PARALLELS
from fasttrain.server import LAUNCHER_PID  # set by `launch` for its workers


@dataclass
class Runtime:
    parallel: str
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    warnings: list[str] = field(default_factory=list)
    device_ids: list[int] | None = None  # dp on GPUs: the ones nn.DataParallel spreads over

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def mode(self) -> ParallelMode:
        return MODES[self.parallel]

    @property
    def distributed(self) -> bool:
        """Several processes, one per device, in one process group."""
        return self.mode.processes

    @property
    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return "CPU"

    @property
    def replicas(self) -> int:
        """Devices one optimizer step runs on: processes under ddp, GPUs under dp."""
        if self.device_ids:
            return len(self.device_ids)
        return self.world_size


# torchrun's agent passes the signals it handles on to its workers, then waits for them (30 s, then
# SIGKILL); SIGUSR1 (SLURM's --signal) is not among its defaults, and would kill the launcher outright.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# Site settings, not recipe: they never change a result, so they are environment variables, not params
# (a param would show in dvc.lock and re-run the stage whenever a job lands on other hosts).
RDZV_ENDPOINT = "FASTTRAIN_RDZV_ENDPOINT"  # host:port of node 0, for `train.nnodes` > 1 outside SLURM
DIST_TIMEOUT = "FASTTRAIN_DIST_TIMEOUT"  # seconds a rank waits for the others (collectives, rendezvous)


@dataclass(frozen=True)
class Placement:
    """Where this process sits in a ddp run, as the program that started it says."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int  # processes on this node
    by: str  # "torchrun" or "srun"


def placement() -> Placement | None:
    """torchrun's variables (ours, or a user's on one node or several), else those of an srun step of
    2+ tasks, else None: not a ddp worker. The step's SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: a batch
    script has SLURM_NTASKS and SLURM_PROCID=0 too, and a `dvc repro` there must start workers, not be one."""
    env = os.environ
    if "LOCAL_RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return Placement(int(env.get("RANK", "0")), int(env["LOCAL_RANK"]), world,
                         int(env.get("LOCAL_WORLD_SIZE", world)), "torchrun")
    if int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        per_node = slurm_counts(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
        node = int(env.get("SLURM_NODEID", "0"))
        return Placement(int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_STEP_NUM_TASKS"]),
                         per_node[min(node, len(per_node) - 1)], "srun")
    return None


def slurm_counts(spec: str) -> list[int]:
    """SLURM's per-node counts, expanded: "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        n, _, repeat = part.partition("(x")
        counts += [int(n)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts


def under_torchrun() -> bool:
    """A ddp worker already (torchrun's or srun's): it joins the run instead of starting one."""
    return placement() is not None


def current_world_size() -> int:
    where = placement()
    return where.world_size if where else 1


def default_nproc() -> int:
    """One process per visible GPU; two gloo processes on a machine without one, so ddp is still real."""
    return torch.cuda.device_count() or 2


def check_nproc(nproc: int, device_type: str, what: str = "ddp processes") -> None:
    gpus = torch.cuda.device_count()
    if device_type == "cuda" and nproc > gpus:
        raise FasttrainError(f"train.nproc = {nproc} {what} but only {gpus} GPU(s) visible: "
                             f"set train.nproc to at most {gpus} or null")


def check_node_gpus(where: Placement) -> None:
    """One GPU per process on each node: this node's process count (LOCAL_WORLD_SIZE), not the world
    size, against the GPUs this node sees. 2 nodes x 8 GPUs is 16 processes and 8 GPUs per node."""
    gpus = torch.cuda.device_count()
    if where.local_world_size > gpus or where.local_rank >= gpus:
        flag = "--ntasks-per-node" if where.by == "srun" else "--nproc-per-node (train.nproc)"
        raise FasttrainError(f"{where.local_world_size} ddp processes on this node (local rank {where.local_rank}) "
                             f"but only {gpus} GPU(s) visible here: start at most {gpus} per node with {flag}")


def dist_timeout() -> datetime.timedelta:
    """How long a rank waits for the others before it gives up ($FASTTRAIN_DIST_TIMEOUT, default 600 s):
    a node that dies, hangs or never comes makes the rest exit within this, never hang."""
    raw = os.environ.get(DIST_TIMEOUT, "600")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise FasttrainError(f"{DIST_TIMEOUT} = {raw!r} is not a number of seconds > 0 (default 600)")
    return datetime.timedelta(seconds=seconds)


def rdzv_endpoint() -> str:
    endpoint = os.environ.get(RDZV_ENDPOINT, "")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise FasttrainError(f"train.nnodes > 1 needs {RDZV_ENDPOINT}=HOST:PORT (node 0's address and a free port, "
                             f"the same on every node), got {endpoint!r}; or run inside a SLURM allocation")
    return endpoint


def _agent_failure_lines(record: logging.LogRecord) -> bool:
    """False for the elastic agent's lines on a failed worker group ("failed (exitcode: 1) local_rank: 0
    (pid ...) of binary ...", "Sending process N closing signal SIGTERM"): launch's one line says the
    same and names the rank that failed first. Its restarts (agent.server.api) still show."""
    return not record.getMessage().startswith(("failed (exitcode", "Sending process"))


def launch(module_argv: list[str], nproc: int, max_restarts: int = 0, device: str = "cuda",
           nnodes: int = 1, run_id: str = "fasttrain") -> None:
    """Re-run this command under torchrun (torch.distributed.run) with `nproc` workers on this node.

    One node: `--standalone`, a local c10d rendezvous on a free port, so two runs on one machine never
    collide. `nnodes` > 1: inside a SLURM allocation, srun starts every node's workers from here
    (launch_srun); elsewhere this node joins a c10d rendezvous at $FASTTRAIN_RDZV_ENDPOINT named
    `run_id`, and every other node runs the same command. Raises FasttrainError naming the failed
    rank when the workers fail for good. With `device` auto and GPUs, this launcher leases `nproc`
    GPUs for its workers (they see only those, local rank i on the i-th) and holds them while
    torchrun runs, restarts included.
    """
    if nnodes > 1 and os.environ.get("SLURM_JOB_ID"):
        return launch_srun(module_argv, nproc, nnodes, max_restarts)
    if nnodes > 1:
        timeout = int(dist_timeout().total_seconds())
        rdzv = [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint()}",
                f"--rdzv-id={run_id}", f"--rdzv-conf=join_timeout={timeout},close_timeout={min(timeout, 60)}"]
    else:
        rdzv = ["--standalone"]
    if device == "auto" and torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(lease.hold(nproc).ids)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args([
        *rdzv, f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1", f"--signals-to-handle={HANDLED_SIGNALS}", "--module", "fasttrain", *module_argv,
    ])
    # torchrun would set 1 thread per worker and print a banner saying so; share the cores instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # The agent's shared TCPStore outlives a restart with the last attempt's keys in it, so restarted
    # workers may read dead peers' addresses and hang or fail (pytorch/pytorch#135712, still so in
    # torch 2.14): let each attempt's rank 0 host a fresh store instead.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[LAUNCHER_PID] = str(os.getpid())  # die_with_launcher
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    if _agent_failure_lines not in agent_log.filters:
        agent_log.addFilter(_agent_failure_lines)
    try:
        run(args)
    except ChildFailedError as e:
        rank, failure = root_failure(e.failures)
        if failure.exitcode == Preempted.exit_status:  # the workers were signalled, not the launcher
            raise Preempted(f"ddp workers stopped by a signal after their checkpoint: run the same "
                            f"command again to resume (exit {Preempted.exit_status})") from None
        raise FasttrainError(f"ddp worker rank {rank} failed with exit code {failure.exitcode} "
                             f"after {max_restarts} restart(s); see its output above") from None
    except SignalException as e:  # the agent stopped its workers; Ctrl-C ends like any interrupt
        if e.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        if e.sigval in (signal.SIGTERM, signal.SIGUSR1):  # the workers checkpoint at an agreed step
            raise Preempted(f"ddp run stopped by {e.sigval.name}: its workers were passed it, to save a "
                            f"checkpoint at the step they agree on (torchrun waits 30 s for them); run the "
                            f"same command again to resume (exit {Preempted.exit_status})") from None
        raise FasttrainError(f"ddp run stopped by signal {e.sigval.name}; its workers were stopped too") from None
    except Exception as e:  # noqa: BLE001 (the rendezvous: RendezvousTimeoutError, ...ClosedError, a refused connection)
        raise FasttrainError(f"ddp rendezvous failed ({type(e).__name__}: {_first_line(e)}); "
                             f"the other nodes did not all join within {DIST_TIMEOUT}") from None


def launch_srun(module_argv: list[str], nproc: int, nnodes: int, max_restarts: int = 0) -> None:
    """Start every node's workers with one srun step from inside a SLURM allocation (a `dvc repro` in
    an sbatch script): nnodes x nproc tasks, each a ddp worker that reads its place from SLURM's
    variables (placement). Task 0, the global rank 0 that writes, runs on the allocation's first node,
    the one a batch script runs on. srun ends the step when a task fails (--kill-on-bad-exit)."""
    if max_restarts:
        print(f"fasttrain: run.max_restarts = {max_restarts} is torchrun's; under srun a failed run is "
              "resumed by running it again (sbatch --requeue)", file=sys.stderr)
    cmd = ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes * nproc}", f"--ntasks-per-node={nproc}",
           "--kill-on-bad-exit=1", sys.executable, "-m", "fasttrain", *module_argv]
    try:
        code = subprocess.run(cmd, check=False).returncode
    except FileNotFoundError:
        raise FasttrainError("SLURM_JOB_ID is set but srun is not on PATH: run inside an allocation (sbatch, salloc) "
                             f"or unset SLURM_JOB_ID and use {RDZV_ENDPOINT}") from None
    if code:
        raise FasttrainError(f"srun's ddp step exited with code {code}; see the tasks' output above")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def die_with_launcher() -> None:
    """In a ddp worker that `launch` started: get SIGTERM when the launcher dies, even by SIGKILL
    (`dvc queue stop --kill`, the OOM killer), which its agent cannot pass on. torchrun starts its
    workers in sessions of their own, so they would otherwise train on, orphaned, on GPUs whose lease
    ended with the launcher. A worker forked by `fasttrain serve` is its server's child: the process
    it serves did this (server.forward), and passes the signal on. Linux only (prctl)."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is not None and not server.served():
        server.die_with_parent(int(launcher))


def resolve_device(requested: str, lease_gpus: int = 0) -> torch.device:
    """cpu or cuda:0; under `auto` with `lease_gpus` > 0, the first of that many GPUs that no other
    fasttrain run holds, kept for this process's lifetime (lease.py). `cuda` never leases."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise FasttrainError("train.device = cuda but no GPU is visible: use auto or cpu")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if requested == "auto" and lease_gpus:
        return torch.device("cuda", lease.hold(lease_gpus).indices[0])
    return torch.device("cuda", 0)


def setup(parallel: str, device: str = "auto", nproc: int | None = None) -> Runtime:
    """The runtime of a variant. `nproc` (train.nproc) is, for dp on GPUs, how many GPUs
    nn.DataParallel spreads over (None: every visible one); ddp's comes from torchrun."""
    if parallel not in MODES:
        raise FasttrainError(f"unknown parallel variant '{parallel}': choose {', '.join(MODES)}")
    rt = MODES[parallel].setup(device, nproc)
    if not rt.distributed and rt.device.type == "cuda":
        torch.cuda.set_device(rt.device)
    return rt


def _setup_single(device: str, nproc: int | None) -> Runtime:
    return Runtime("single", resolve_device(device, lease_gpus=1))


def _setup_dp(device: str, nproc: int | None) -> Runtime:
    """dp leases every GPU it spreads over (auto), else takes the first `gpus` visible ones (cuda)."""
    gpus = 0
    if torch.cuda.is_available() and device != "cpu":
        gpus = nproc or torch.cuda.device_count()
        check_nproc(gpus, "cuda", what="GPUs for dp")
    rt = Runtime("dp", resolve_device(device, lease_gpus=gpus))
    if rt.device.type != "cuda":
        rt.warnings.append("dp without a GPU runs as one process: nn.DataParallel needs CUDA devices")
    else:
        rt.device_ids = lease.hold(gpus).indices if device == "auto" else list(range(gpus))
    return rt


def _setup_ddp(device: str, nproc: int | None) -> Runtime:
    """A worker's place, its device and the process group. Workers use the GPUs their launcher leased
    for them (launch), or all under a user's torchrun."""
    base = resolve_device(device)
    where = placement()
    if where is None:
        raise FasttrainError("ddp must run under torchrun or srun; `fasttrain train --parallel ddp` starts it for you")
    die_with_launcher()
    if where.by == "srun":
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = slurm_master()
    rank, local_rank, world_size = where.rank, where.local_rank, where.world_size
    if base.type == "cuda":
        check_node_gpus(where)
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=dist_timeout(),
                                device_id=dev if backend == "nccl" else None)
    return Runtime("ddp", dev, rank, local_rank, world_size)


def slurm_master() -> tuple[str, str]:
    """MASTER_ADDR and MASTER_PORT for an srun step: as exported, else the step's first node (what
    `scontrol show hostnames` lists first) and a port derived from the job id, the same on every node."""
    addr = os.environ.get("MASTER_ADDR")
    if not addr:
        nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
        try:
            addr = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True,
                                  check=True).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            raise FasttrainError("srun: MASTER_ADDR is not set and `scontrol show hostnames` named no first node: "
                                 "export MASTER_ADDR=<first node> in the batch script") from None
    port = os.environ.get("MASTER_PORT") or str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000)
    return addr, port


def check_same_file(path: Path, rt: Runtime) -> None:
    """Every rank must read the same `path` (the data set): its sha256 is compared across ranks in one
    gather, so a node with a missing or different copy is one error on every rank, not a hang (one
    rank failing alone leaves the rest waiting in a collective) or a silent mismatch."""
    if not rt.distributed:
        return
    digest = None
    if path.is_file():
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    everyone: list = [None] * rt.world_size
    dist.all_gather_object(everyone, (socket.gethostname(), digest))
    if len({d for _, d in everyone}) == 1:
        return
    groups: dict = {}
    for rank, (host, d) in enumerate(everyone):
        groups.setdefault(d, []).append(f"{rank}@{host}")
    seen = "; ".join(f"{'missing' if d is None else 'sha256 ' + d} on rank(s) {', '.join(r[:4])}"
                     f"{' ...' if len(r) > 4 else ''}" for d, r in groups.items())
    raise FasttrainError(f"{path} is not the same on every node ({seen}): copy one file to every node "
                         f"or keep the repository on storage they all see")


def root_failure(failures: dict) -> tuple:
    """(rank, failure) to name from torchrun's failed workers: the earliest to fail on its own. Ranks
    that only lost it (PeersLost's exit status) or that torchrun itself stopped once another had failed
    (killed by SIGTERM, its signal to the rest, often seen in the same whole second as the failure)
    count only when no other rank failed."""
    followers = (PeersLost.exit_status, -signal.SIGTERM)
    own = {rank: f for rank, f in failures.items() if f.exitcode not in followers} or failures
    rank = min(own, key=lambda r: (own[r].timestamp, r))
    return rank, own[rank]


@contextlib.contextmanager
def peers_lost_as_errors(rt: Runtime):
    """A collective that fails because another rank died or stopped answering (gloo: connection
    closed, timed out; NCCL: DistBackendError) ends this rank with one line, not a traceback."""
    try:
        yield
    except FasttrainError:
        raise
    except (dist.DistError, RuntimeError) as e:
        line = _first_line(e)
        if not rt.distributed or not isinstance(e, dist.DistError) and "gloo" not in line.lower():
            raise
        raise PeersLost(f"ddp rank {rt.rank} of {rt.world_size} on {socket.gethostname()} lost the other ranks "
                             f"({line}): a node died or stopped answering within {DIST_TIMEOUT}") from None


def prepare_model(model: nn.Module, sync_bn: bool) -> nn.Module:
    """Layer conversions that must happen before the optimizer sees the parameters (`sync_bn`: as
    switches.decide plans it, ddp on GPUs)."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync_bn else model


class ReplicaThreads:
    """One long-lived thread per replica, where nn.DataParallel starts a new thread per replica every
    step. Per-thread state then lasts from step to step: cuDNN's execution plans and benchmark
    results are cached per thread, so in new threads every forward built its plans again. Each
    replica runs as torch's parallel_apply runs it: on its device and that device's current stream,
    in the caller's grad mode and autocast state; an exception is raised in the caller."""

    def __init__(self, replicas: int):
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"fasttrain-replica-{i}") for i in range(replicas)]

    def run(self, modules, inputs, kwargs, devices) -> list:
        grad_enabled = torch.is_grad_enabled()
        cuda = all(d is not None for d in devices) and torch.cuda.is_available()
        autocast = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")) if cuda else None
        streams = [torch.cuda.current_stream(d) for d in devices] if cuda else [None] * len(devices)

        def forward(module, args, kw, device, stream):
            torch.set_grad_enabled(grad_enabled)  # thread-local, as the autocast state
            with contextlib.ExitStack() as scope:
                if cuda:
                    scope.enter_context(torch.cuda.device(device))
                    scope.enter_context(torch.cuda.stream(stream))
                    scope.enter_context(torch.autocast("cuda", enabled=autocast[0], dtype=autocast[1]))
                return module(*(args if isinstance(args, (list, tuple)) else (args,)), **kw)

        futures = [pool.submit(forward, *job) for pool, job in
                   zip(self.pools, zip(modules, inputs, kwargs, devices, streams, strict=True))]
        return [f.result() for f in futures]


class DataParallel(nn.DataParallel):
    """nn.DataParallel with its replicas' forwards run by `ReplicaThreads` (the rest is torch's:
    scatter, replicate, gather, and the backward in autograd's own per-device threads)."""

    def __init__(self, module: nn.Module, device_ids: list[int] | None = None):
        super().__init__(module, device_ids=device_ids)
        self.replica_threads = ReplicaThreads(len(self.device_ids))

    def parallel_apply(self, replicas, inputs, kwargs):
        return self.replica_threads.run(replicas, inputs, kwargs, self.device_ids[:len(replicas)])


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream on which a device's CUDA-graph warm-up and capture run, and DDP is built."""
    return torch.cuda.Stream(device)


def wrap(model: nn.Module, rt: Runtime, graphs: bool = False) -> nn.Module:
    """The model for the variant's training: DDP, fasttrain's DataParallel, or itself."""
    return rt.mode.wrap(model, rt, graphs)


def wrap_for_inference(model: nn.Module, rt: Runtime) -> nn.Module:
    """The model for the variant's evaluation (no gradients to synchronise)."""
    return rt.mode.wrap_for_inference(model, rt)


def _itself(model: nn.Module, rt: Runtime, graphs: bool = False) -> nn.Module:
    return model


def _wrap_dp(model: nn.Module, rt: Runtime, graphs: bool = False) -> nn.Module:
    """fasttrain's DataParallel over the runtime's GPUs; one process on a CPU, the model itself."""
    return DataParallel(model, device_ids=rt.device_ids) if rt.device.type == "cuda" else model


def _wrap_ddp(model: nn.Module, rt: Runtime, graphs: bool = False) -> nn.Module:
    """DDP. With `graphs` (the step will be captured), DDP is built on the capture stream, as a
    whole-step capture needs (torch's CUDA-graph notes): DDP keeps each parameter's gradient
    accumulator, which remembers the stream it was made on, and a backward that reaches it from
    another stream syncs the two streams and warns. Without graphs it is built on the current
    stream, where the steps then run."""
    if rt.device.type != "cuda":
        return nn.parallel.DistributedDataParallel(model)
    if not graphs:
        return nn.parallel.DistributedDataParallel(model, device_ids=[rt.local_rank])
    side = capture_stream(rt.device)
    side.wait_stream(torch.cuda.current_stream(rt.device))
    with torch.cuda.stream(side):
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rt.local_rank])
    torch.cuda.current_stream(rt.device).wait_stream(side)
    return ddp


def _this_rank_only(obj: Any, rt: Runtime) -> list:
    return [obj]


def _every_rank(obj: Any, rt: Runtime) -> list:
    ranks: list = [None] * rt.world_size
    dist.all_gather_object(ranks, obj)
    return ranks


@dataclass(frozen=True)
class ParallelMode:
    """One parallel variant. The saved state is the same for every mode: rank 0 writes the bare model
    (`unwrap`), the optimizer and one entry per rank of what differs between ranks (RNG, a partial
    epoch's step log), which `all_ranks` brings to it; on loading, every rank reads the file and
    takes its own entry (`[rt.rank]`)."""
    name: str
    processes: bool  # one process per device, started by `launch` (torchrun, srun); world size from it
    setup: Callable[[str, int | None], Runtime]  # (train.device, train.nproc) -> this process's runtime
    wrap: Callable[[nn.Module, Runtime, bool], nn.Module]  # (model, runtime, graphs) -> what training calls
    wrap_for_inference: Callable[[nn.Module, Runtime], nn.Module]  # ddp ranks each run their shard plainly
    all_ranks: Callable[[Any, Runtime], list]  # this rank's part of the saved state -> every rank's, in order
    not_capturable: str | None = None  # why its step cannot be replayed from CUDA graphs (None: it can)
    replica_threads: bool = False  # its replicas run in threads of one process (switches.decide: cuDNN's benchmark)


MODES: dict[str, ParallelMode] = {
    m.name: m
    for m in (
        ParallelMode("single", False, _setup_single, _itself, _itself, _this_rank_only),
        ParallelMode("dp", False, _setup_dp, _wrap_dp, _wrap_dp, _this_rank_only,
                     not_capturable="nn.DataParallel copies the model to every GPU and runs the replicas from "
                                    "several threads each step, which one graph cannot record",
                     replica_threads=True),
        ParallelMode("ddp", True, _setup_ddp, _wrap_ddp, _itself, _every_rank),
    )
}

assert tuple(MODES) == PARALLELS


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under any wrapper (DDP, DataParallel, torch.compile, AutocastForward)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def all_reduce(t: torch.Tensor, rt: Runtime, op: str = "sum") -> torch.Tensor:
    """Sum (or max) a tensor over ranks, in place; a no-op outside ddp.

    gloo and nccl both reduce on the tensor's own device, so it stays where the caller made it.
    """
    if rt.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t


def teardown(rt: Runtime) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def silence_non_main(rt: Runtime) -> None:
    """Rank > 0 prints nothing but errors: one run, one log."""
    if not rt.is_main:
        warnings.filterwarnings("ignore")
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
