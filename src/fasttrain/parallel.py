"""Parallelism in one place: launch, set up, wrap, unwrap, reduce, tear down, "am I the main process".

Only this module reads RANK / LOCAL_RANK / WORLD_SIZE. The training loop receives a Runtime and a
wrapped model and never asks which variant it runs.
"""

from __future__ import annotations

import datetime
import functools
import os
import signal
import sys
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from fasttrain import lease
from fasttrain.errors import FasttrainError, Preempted
from fasttrain.layout import PARALLELS


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
    def distributed(self) -> bool:
        return self.parallel == "ddp"

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


LAUNCHER_PID = "FASTTRAIN_LAUNCHER_PID"  # set by `launch` for its workers
# torchrun's agent passes the signals it handles on to its workers, then waits for them (30 s, then
# SIGKILL); SIGUSR1 (SLURM's --signal) is not among its defaults, and would kill the launcher outright.
HANDLED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def current_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_nproc() -> int:
    """One process per visible GPU; two gloo processes on a machine without one, so ddp is still real."""
    return torch.cuda.device_count() or 2


def check_nproc(nproc: int, device_type: str, what: str = "ddp processes") -> None:
    gpus = torch.cuda.device_count()
    if device_type == "cuda" and nproc > gpus:
        raise FasttrainError(f"train.nproc = {nproc} {what} but only {gpus} GPU(s) visible: "
                             f"set train.nproc to at most {gpus} or null")


def launch(module_argv: list[str], nproc: int, max_restarts: int = 0, device: str = "cuda") -> None:
    """Re-run this command under torchrun (torch.distributed.run) with `nproc` workers.

    `--standalone` gives a local c10d rendezvous on a free port, so two runs on one machine never
    collide. Raises FasttrainError naming the failed rank when the workers fail for good.
    With `device` auto and GPUs, this launcher leases `nproc` GPUs for its workers (they see only
    those, local rank i on the i-th) and holds them while torchrun runs, restarts included.
    """
    if device == "auto" and torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(lease.hold(nproc).ids)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args([
        "--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "--monitor-interval=0.5", f"--signals-to-handle={HANDLED_SIGNALS}", "--module", "fasttrain", *module_argv,
    ])
    # torchrun would set 1 thread per worker and print a banner saying so; share the cores instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # The agent's shared TCPStore outlives a restart with the last attempt's keys in it, so restarted
    # workers may read dead peers' addresses and hang or fail (pytorch/pytorch#135712, still so in
    # torch 2.14): let each attempt's rank 0 host a fresh store instead.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[LAUNCHER_PID] = str(os.getpid())  # die_with_launcher
    try:
        run(args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
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


def die_with_launcher() -> None:
    """In a ddp worker that `launch` started: get SIGTERM when the launcher dies, even by SIGKILL
    (`dvc queue stop --kill`, the OOM killer), which its agent cannot pass on. torchrun starts its
    workers in sessions of their own, so they would otherwise train on, orphaned, on GPUs whose lease
    ended with the launcher. Linux only (prctl); elsewhere a no-op."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher):  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


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
    if parallel not in PARALLELS:
        raise FasttrainError(f"unknown parallel variant '{parallel}': choose {', '.join(PARALLELS)}")
    # single leases one GPU, dp all it spreads over; ddp workers use the GPUs their launcher leased
    # for them (launch), or all under a user's torchrun.
    gpus = 1 if parallel == "single" else 0
    if parallel == "dp" and torch.cuda.is_available() and device != "cpu":
        gpus = nproc or torch.cuda.device_count()
        check_nproc(gpus, "cuda", what="GPUs for dp")
    base = resolve_device(device, lease_gpus=gpus)
    if parallel != "ddp":
        rt = Runtime(parallel, base)
        if parallel == "dp" and base.type != "cuda":
            rt.warnings.append("dp without a GPU runs as one process: nn.DataParallel needs CUDA devices")
        elif parallel == "dp":  # the leased GPUs (auto), else the first `gpus` visible ones (cuda)
            rt.device_ids = (lease.hold(gpus).indices if device == "auto" else list(range(gpus)))
        if base.type == "cuda":
            torch.cuda.set_device(base)
        return rt
    if not under_torchrun():
        raise FasttrainError("ddp must run under torchrun; `fasttrain train --parallel ddp` starts it for you")
    die_with_launcher()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if base.type == "cuda":
        check_nproc(world_size, "cuda")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10),
                                device_id=dev if backend == "nccl" else None)
    return Runtime("ddp", dev, rank, local_rank, world_size)


def cudnn_benchmark(requested: bool, rt: Runtime) -> bool:
    """Whether cuDNN may time its convolution algorithms (train.cudnn_benchmark) for this runtime.
    Not for nn.DataParallel over 2+ GPUs: it runs each replica's forward in threads it makes anew
    every step, and cuDNN's benchmark results are kept per thread (pytorch/pytorch#191617, #191744),
    so every step would search again: dp-bf16 at batch 1024 on two H200s ran at 1,449 images/s."""
    if requested and rt.parallel == "dp" and rt.replicas > 1:
        rt.warnings.append(f"train.cudnn_benchmark off: nn.DataParallel over {rt.replicas} GPUs makes "
                           "new threads every step, and cuDNN keeps its benchmark results per thread")
        return False
    return requested


def prepare_model(model: nn.Module, rt: Runtime, sync_bn: bool) -> nn.Module:
    """Layer conversions that must happen before the optimizer sees the parameters."""
    if rt.distributed and sync_bn:
        if rt.device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            rt.warnings.append("train.sync_bn ignored: SyncBatchNorm needs GPUs")
    return model


def wrap(model: nn.Module, rt: Runtime) -> nn.Module:
    if rt.parallel == "ddp" and rt.device.type == "cuda":
        # built on a side stream, as a whole-step CUDA-graph capture needs (torch's CUDA-graph notes)
        side = torch.cuda.Stream(rt.device)
        side.wait_stream(torch.cuda.current_stream(rt.device))
        with torch.cuda.stream(side):
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rt.local_rank])
        torch.cuda.current_stream(rt.device).wait_stream(side)
        return ddp
    if rt.parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if rt.parallel == "dp" and rt.device.type == "cuda":
        return nn.DataParallel(model, device_ids=rt.device_ids)
    return model


def wrap_for_inference(model: nn.Module, rt: Runtime) -> nn.Module:
    """No gradients to synchronise: ddp ranks each run their shard of the data on a plain model."""
    if rt.parallel == "dp" and rt.device.type == "cuda":
        return nn.DataParallel(model, device_ids=rt.device_ids)
    return model


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


@functools.cache
def _fault_spec() -> tuple[int, int, int, bool] | None:
    spec = os.environ.get("FASTTRAIN_FAULT_KILL_RANK_AT")
    if not spec:
        return None
    rank, at_epoch, at_step, *always = spec.split(":")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return int(rank), int(at_epoch), int(at_step), first_attempt or always == ["always"]


@functools.cache
def _signal_spec() -> tuple[signal.Signals, int, int, int] | None:
    spec = os.environ.get("FASTTRAIN_FAULT_SIGNAL_AT")
    if not spec:
        return None
    name, rank, at_epoch, at_step = spec.split(":")
    return signal.Signals[name], int(rank), int(at_epoch), int(at_step)


def inject_fault(rt: Runtime, epoch: int, step: int) -> None:
    """Test hooks, for the restart and preemption tests only (no param: never set by accident).

    FASTTRAIN_FAULT_KILL_RANK_AT="<rank>:<epoch>:<step>" makes that rank SIGKILL itself at that
    1-based epoch and step, on torchrun's first attempt only; a fourth field "always" kills it on
    every attempt, so the restart budget runs out.
    FASTTRAIN_FAULT_SIGNAL_AT="<SIGNAL>:<rank>:<epoch>:<step>" makes that rank send the signal, just
    before that step, to the process a scheduler would signal: the launcher under `fasttrain train
    --parallel ddp`, else itself. Read once per process: this runs every step.
    """
    spec = _fault_spec()
    if spec is not None and spec[3] and spec[:3] == (rt.rank, epoch, step):
        os.kill(os.getpid(), signal.SIGKILL)
    sig = _signal_spec()
    if sig is not None and sig[1:] == (rt.rank, epoch, step):
        os.kill(int(os.environ.get(LAUNCHER_PID, os.getpid())), sig[0])


def teardown(rt: Runtime) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def silence_non_main(rt: Runtime) -> None:
    """Rank > 0 prints nothing but errors: one run, one log."""
    if not rt.is_main:
        warnings.filterwarnings("ignore")
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
