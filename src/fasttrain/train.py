"""Train one variant: one loop for every precision and parallel variant.

The loop gets a Runtime (where am I, which rank) and a wrapped model; the precision entry decides
what autocast and the GradScaler do. It never branches on the variant's name.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import os
import random
import re
import resource
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click
import torch

from fasttrain import atomic, checkpoint, clock, config, graphs, parallel, preemption, switches
from fasttrain.data import Dataset, load_dataset
from fasttrain.errors import FasttrainError, Preempted
from fasttrain.evaluate import evaluate_model
from fasttrain.layout import Layout
from fasttrain.engine import (StepLog, Trainable, build_trainable, compile_cache_lookups,
                              nondeterministic_ops_recorded,
                              set_deterministic, synchronize, train_step, warm_up)
from fasttrain.loaders import GpuLoader, Loader, input_dtype, loader_args, make_eval_loader, make_train_loader
from fasttrain.models import check_img_size
from fasttrain.precision import Precision
from fasttrain.progress import Progress
from fasttrain.variant import run_variant, variant_options


def check_train(params: config.Params, world_size: int) -> None:
    """Everything that can be rejected before a process is started or a file is touched: the sizes
    the model takes, and the combinations switches.decide refuses (they depend on the world size
    alone, so a runtime of that size, not yet set up, is enough to ask)."""
    cfg = params.train
    check_img_size(params.model.name, cfg.img_size)
    if cfg.progressive_epochs:
        check_img_size(params.model.name, cfg.progressive_size, "train.progressive_size")
    switches.decide(params, parallel.Runtime("single", torch.device("cpu"), world_size=world_size))


def resolved_config(params: config.Params, parallel_name: str, precision_name: str, world_size: int,
                    dataset: Dataset | None = None) -> dict:
    """What the run depends on: the params that shape training, the data set it trains on, the variant
    and the world size."""
    # data: how batches are made, not the download stage's keys, which made data/dataset.pt (a
    # dependency of the stage as a file); the data set itself by what it was made from and its size
    resolved = {"data": {k: getattr(params.data, k) for k in ("loader", "augment", "workers", "pin_memory")},
                "model": config.to_dict(params.model), "train": config.to_dict(params.train)}
    if dataset is not None:
        resolved["dataset"] = {"source": dataset.source, "classes": list(dataset.classes),
                               "train_images": len(dataset.train_labels), "test_images": len(dataset.test_labels)}
    # how the step is launched, not what it computes: a checkpoint of a graphed run resumes eagerly (the
    # run: section, how a run is watched, checkpointed and restarted, is not in here at all)
    resolved["train"].pop("cuda_graphs")
    resolved["variant"] = {"parallel": parallel_name, "precision": precision_name, "world_size": world_size}
    return resolved


def train_size(cfg: config.TrainConfig, epoch: int) -> int:
    """The resolution epoch `epoch` (from 0) trains at: progressive_size for the first
    progressive_epochs, img_size after."""
    return cfg.progressive_size if epoch < cfg.progressive_epochs else cfg.img_size


def train_sizes(cfg: config.TrainConfig) -> list[int]:
    """The resolutions training runs at, in order of first use."""
    return list(dict.fromkeys(train_size(cfg, epoch) for epoch in range(cfg.epochs)))


def peak_memory_mb(rt: parallel.Runtime) -> tuple[float, str]:
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, "cpu_max_rss"


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """The generators' states as rng_state() took them: byte tensors, which torch wants on the CPU."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def make_scheduler(cfg: config.TrainConfig, optimizer, steps_per_epoch: int):
    if cfg.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=cfg.plateau_factor,
                                                          patience=cfg.plateau_patience)
    if cfg.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, epochs=cfg.epochs,
                                                   steps_per_epoch=steps_per_epoch, cycle_momentum=cfg.cycle_momentum)
    return None


@dataclass
class EpochRecord:
    epoch: int
    seconds: float
    train_loss: float
    test_accuracy: float | None
    lr: float
    images: int
    img_size: int | None = None  # the training resolution (None in checkpoints from before progressive resizing)
    max_grad_norm: float | None = None  # the largest gradient norm of the epoch's steps, before clipping (grad_clip only)
    eval_seconds: float | None = None  # the test-set evaluation after the epoch (outside `seconds`)

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


@dataclass
class TrainState:
    """Everything a checkpoint restores; the rest of a run is re-derived from params."""
    epoch: int = 0  # epochs completed
    global_step: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    skipped_steps: int = 0
    epoch_steps: int = 0  # steps done of epoch `epoch` + 1 (a checkpoint written on SIGTERM, mid-epoch)
    epoch_seconds: float = 0.0  # and the seconds they took


def _state_to_dict(state: TrainState) -> dict:
    return {"epoch": state.epoch, "global_step": state.global_step, "skipped_steps": state.skipped_steps,
            "history": [vars(r) for r in state.history], "epoch_steps": state.epoch_steps,
            "epoch_seconds": state.epoch_seconds}


def _state_from_dict(d: dict) -> TrainState:
    return TrainState(d["epoch"], d["global_step"], [EpochRecord(**r) for r in d["history"]], d["skipped_steps"],
                      d.get("epoch_steps", 0), d.get("epoch_seconds", 0.0))


def config_changes(saved: dict, now: dict) -> list[str]:
    """'section.key: old -> new' for every setting where two resolved configs differ."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    a, b = flat(saved), flat(now)
    return [f"{k}: {a.get(k, '(none)')!r} -> {b.get(k, '(none)')!r}" for k in sorted(a.keys() | b.keys())
            if a.get(k, "(none)") != b.get(k, "(none)")]


def checkpoint_to_resume(path: Path, digest: str, explicit: bool, resolved: dict | None = None) -> dict | None:
    """The training checkpoint to resume from, or None for a fresh run.

    A finished run found in its checkpoints/ folder (a finished run removes its own; this one was copied in or
    left by an older fasttrain) is not resumed (re-running a stage measures it again), and it may
    come from any config; an unfinished one from another config is refused rather than
    silently thrown away. A checkpoint named with --resume must exist, load and be unfinished.
    """
    if not explicit and not path.exists():
        return None
    # memory-mapped: a finished run's 685 MB (AlexNet with AdamW's state) is not read to learn that it
    # is finished; a resumed one's tensors are read as they are copied into the model and optimizer
    ckpt = checkpoint.load(path, mmap=True)  # missing, corrupt, or code in it: an error
    missing = sorted({"optimizer", "scaler", "state", "rng", "config", "config_hash"} - set(ckpt))
    if missing:
        raise FasttrainError(f"{path} is not a training checkpoint (no {', '.join(missing)}): "
                             f"a final model cannot be resumed; use checkpoints/<variant>/<hash>/last.pt")
    done, planned = ckpt["state"]["epoch"], ckpt["config"]["train"]["epochs"]
    if done >= planned:
        if explicit:
            raise FasttrainError(f"{path} is a finished run ({done} of {planned} epochs): nothing to resume")
        return None
    if ckpt["config_hash"] != digest:
        changes = config_changes(ckpt["config"], resolved) if resolved is not None else []
        what = f": {'; '.join(changes[:4])}{' ...' if len(changes) > 4 else ''}" if changes else ""
        raise FasttrainError(f"{path} is from another config (hash {ckpt['config_hash']}, now {digest}){what}; "
                             f"restore the params it was made with, or delete it to start afresh")
    return ckpt


@dataclass
class _Run:
    """One variant's training run: what the loop's named steps share."""
    params: config.Params
    precision: Precision
    rt: parallel.Runtime
    layout: Layout
    log: Callable[[str], None]
    dataset: Dataset
    t: Trainable
    train_loader: Loader
    test_loader: Loader
    scheduler: object | None
    resolved: dict
    digest: str
    ckpt_path: Path
    step: Callable  # (x, y) -> (loss, grad norm) as device tensors: train_step, or its CUDA graphs
    stop: preemption.StopRequest
    phase: str = "the warm-up at the real shapes, before the first epoch"  # where an out-of-memory happened
    state: TrainState = field(default_factory=TrainState)
    epoch_log: dict | None = None  # this rank's StepLog of the unfinished epoch it resumes (state.epoch_steps)
    writer: object | None = None  # TensorBoard's SummaryWriter, main process only
    saved_epoch: int = 0  # the epoch the newest checkpoint of this run holds (0: none yet)
    checkpoints_written: int = 0  # by this process
    # compile and capture, reported apart from the epochs
    compile_seconds_each: dict = field(default_factory=dict)  # "BATCHxPIXELS": seconds (train.compile)
    capture_seconds: float | None = None  # train.cuda_graphs
    compile_cache: dict | None = None  # train.compile: the warm-up's cache lookups (engine.compile_cache_lookups)

    @property
    def cfg(self) -> config.TrainConfig:
        return self.params.train

    @property
    def variant(self) -> str:
        return f"{self.rt.parallel}-{self.precision.name}"

    @property
    def per_rank_batch(self) -> int:
        return self.cfg.batch_size // self.rt.world_size


def train(params: config.Params, precision: Precision, rt: parallel.Runtime, layout: Layout,
          log=lambda msg: print(msg, file=sys.stderr, flush=True), resume: Path | None = None) -> dict:
    """Train one variant; writes checkpoints, the final model, TensorBoard logs, the per-epoch table
    and the metrics (rank 0 only). Resumes from `resume`, or else from the variant's unfinished
    last checkpoint. Returns the metrics."""
    wall_start = time.perf_counter()
    with preemption.stop_on_signals(rt) as stop:  # SIGTERM/SIGUSR1: a checkpoint at the step, exit 75
        with clock.phase("prepare"):  # the data set, model, optimizer, loaders, a checkpoint resumed
            run = _prepare(params, precision, rt, layout, log if rt.is_main else lambda msg: None, resume, stop)
        progress = Progress(run.variant, run.cfg.epochs, len(run.train_loader), enabled=rt.is_main)
        with (nondeterministic_ops_recorded(rt) if run.cfg.deterministic else contextlib.nullcontext(),
              _out_of_memory_explained(run)):
            with clock.phase("warm_up"):  # compile, CUDA-graph capture or one eager step at every shape
                _warm_up(run)
            for epoch in range(run.state.epoch, run.cfg.epochs):
                with clock.phase("train"):
                    steps, seconds = _train_epoch(run, epoch, progress)
                whole = steps.steps == len(run.train_loader)  # else stopped mid-epoch by a signal
                if whole:
                    _log_epoch(run, _end_epoch(run, epoch, steps, seconds))
                # none after the last epoch: the final model is written next, and a finished run is never resumed
                due = stop.stopping or run.state.epoch % run.params.run.checkpoint_every == 0
                if due and run.state.epoch < run.cfg.epochs:
                    with clock.phase("checkpoints"):
                        _save_checkpoint(run, None if whole else (steps, seconds))
                if whole and rt.is_main:
                    _write_progress(run)  # for dvc exp show; after the checkpoint, so a full disk loses no training
                if stop.stopping and run.state.epoch < run.cfg.epochs:
                    raise _preempted(run, epoch, steps.steps if not whole else 0)
        return _finish(run, wall_start)


def _preempted(run: _Run, epoch: int, steps: int) -> Preempted:
    at = f"epoch {epoch + 1}, step {steps}" if steps else f"the end of epoch {epoch + 1}"
    again = ("queue the experiment again with the same params" if os.environ.get("DVC_EXP_NAME")
             else "run the same command again")  # DVC names a queued or --temp experiment's run
    return Preempted(f"{run.variant} stopped by {run.stop.name} at {at}; checkpoint {run.ckpt_path}: "
                     f"{again} to resume (exit {preemption.EXIT_PREEMPTED})")


def _prepare(params, precision, rt, layout, log, resume, stop) -> _Run:
    """Data, model, optimizer, loaders and scheduler; the checkpoint resumed, if any."""
    cfg = params.train
    dataset = load_dataset(layout.dataset)
    resolved = resolved_config(params, rt.parallel, precision.name, rt.world_size, dataset)
    digest = config.config_hash(resolved)
    plan = switches.decide(params, rt)
    torch.backends.cudnn.benchmark = plan.cudnn_benchmark
    set_deterministic(cfg.deterministic)  # before any cuBLAS work
    # a switch this variant cannot take (it runs without), or a precision this GPU lacks: said once, kept
    for why_not in (*plan.fallbacks, precision.not_native_on(rt.device)):
        if why_not is not None:
            log(why_not)
            rt.warnings.append(why_not)

    random.seed(cfg.seed)
    t = build_trainable(params, precision, rt, len(dataset.classes), graphs=plan.cuda_graphs)
    torch.manual_seed(cfg.seed + 1 + rt.rank)  # dropout differs per rank, as it would on separate data
    per_rank_batch = cfg.batch_size // rt.world_size
    args = loader_args(params, precision, rt.device, rt.rank, rt.world_size)
    train_loader = make_train_loader(params.data.loader, dataset.train_images, dataset.train_labels,
                                     batch_size=per_rank_batch, augment=params.data.augment, seed=cfg.seed, **args)
    test_loader = make_eval_loader(params.data.loader, dataset.test_images, dataset.test_labels,
                                   batch_size=max(1, params.evaluate.batch_size // rt.world_size), **args)
    step = (graphs.GraphedStep(t, precision, rt) if plan.cuda_graphs
            else lambda x, y: train_step(t, precision, x, y))
    run = _Run(params, precision, rt, layout, log, dataset, t, train_loader, test_loader,
               make_scheduler(cfg, t.optimizer, len(train_loader)), resolved, digest,
               layout.checkpoint_dir(f"{rt.parallel}-{precision.name}", digest) / "last.pt", step, stop)
    _resume(run, resume)
    if rt.is_main:
        from torch.utils.tensorboard import SummaryWriter

        folder = layout.tensorboard(run.variant)
        if run.state.epoch == 0:  # a fresh run: last run's curves would overlay this one's
            shutil.rmtree(folder, ignore_errors=True)
        elif resume is None and not folder.exists() and _kept_tensorboard(run).is_dir():
            # dvc repro deleted the stage's outputs before resuming it: the run's curves up to its checkpoint
            shutil.copytree(_kept_tensorboard(run), folder)
        # a resumed run drops the steps after its checkpoint (global_step is the last one it keeps)
        with atomic.disk_errors(folder, TENSORBOARD):
            run.writer = _GuardedWriter(SummaryWriter(
                str(folder), purge_step=run.state.global_step + 1 if run.state.global_step else None), folder)
    return run


TENSORBOARD = "the TensorBoard log"


class _GuardedWriter:
    """TensorBoard's SummaryWriter, whose full disk or refused permission (its writer thread's
    OSError, raised again by the next call) ends as atomic.DiskError's one line."""

    def __init__(self, writer, folder: Path):
        self._writer, self._folder = writer, folder

    def __getattr__(self, name):
        method = getattr(self._writer, name)

        def guarded(*args, **kwargs):
            with atomic.disk_errors(self._folder, TENSORBOARD):
                return method(*args, **kwargs)
        return guarded


def _resume(run: _Run, resume: Path | None) -> None:
    resume_from = resume or run.ckpt_path
    ckpt = checkpoint_to_resume(resume_from, run.digest, explicit=resume is not None, resolved=run.resolved)
    if ckpt is None:
        others = sorted(p.parent for p in run.ckpt_path.parent.parent.glob("*/last.pt") if p != run.ckpt_path)
        for other in others:  # nothing is thrown away unasked: say that it is there, and what it costs
            megabytes = sum(f.stat().st_size for f in other.rglob("*") if f.is_file()) / 2**20
            run.log(f"{run.variant}: {other} is an unfinished run of other params (or another data set), "
                    f"kept: train with those to resume it, or delete it to free {megabytes:,.0f} MB")
        return
    t = run.t
    t.raw.load_state_dict(ckpt["model"])
    lr_tensor = isinstance(t.optimizer.param_groups[0]["lr"], torch.Tensor)
    t.optimizer.load_state_dict(ckpt["optimizer"])
    for group in t.optimizer.param_groups:  # graphed steps read the lr from a device tensor, eager ones a float
        group["lr"] = (torch.tensor(float(group["lr"]), device=run.rt.device) if lr_tensor
                       else float(group["lr"]))
    t.scaler.load_state_dict(ckpt["scaler"])
    if run.scheduler is not None:
        run.scheduler.load_state_dict(ckpt["scheduler"])
    run.state = _state_from_dict(ckpt["state"])
    run.saved_epoch = run.state.epoch
    set_rng_state(ckpt["rng"][run.rt.rank])
    if run.state.epoch_steps:
        run.epoch_log = ckpt["epoch_logs"][run.rt.rank]
    mid = f" and {run.state.epoch_steps} step(s) of epoch {run.state.epoch + 1}" if run.state.epoch_steps else ""
    run.log(f"{run.variant}: resuming from {resume_from} after epoch {run.state.epoch}{mid}")


def _warm_up(run: _Run) -> None:
    """Compile (train.compile: the full batch at each training resolution; the short last batch runs
    eagerly) and capture the CUDA graphs (train.cuda_graphs: the full and the short last batch at
    each resolution). On a GPU every shape training will meet runs here once (forward and
    backward, then undone), so a batch that does not fit fails here, before the first epoch, and
    not minutes into it; the gpu loader makes a chunk at each resolution first (its kernel's first
    launch and buffers), so no timed epoch carries them."""
    cfg, t, dataset = run.cfg, run.t, run.dataset
    if run.rt.device.type == "cuda" and isinstance(run.train_loader, GpuLoader):
        run.train_loader.warm_up(train_sizes(cfg))
    last = run.train_loader.num_samples % run.per_rank_batch
    shape_args = (len(dataset.classes), cfg.channels_last, run.rt.device,
                  input_dtype(run.params, run.precision))
    if cfg.compile:  # one compile per training resolution, at the full batch (Trainable.net_for)
        n, before = run.per_rank_batch, compile_cache_lookups()
        each = {size: warm_up(t, run.precision, [n], size, *shape_args) for size in train_sizes(cfg)}
        run.compile_seconds_each = {f"{n}x{size}": s for size, s in each.items()}
        run.compile_cache = compile_cache_lookups(since=before)
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        aot = run.compile_cache["aot_autograd"]
        shapes = ", ".join(f"batch {n} at {size} px {s:.1f} s" for size, s in each.items())
        cached = (f"{aot['hit']} of {sum(aot.values())} graph(s) from the compile cache {cache_dir()}"
                  if sum(aot.values()) else "compiled before in this process")
        run.log(f"{run.variant}: compiled in {sum(each.values()):.1f} s ({shapes}); {cached}")
    if isinstance(run.step, graphs.GraphedStep):
        shapes = [(n, size) for size in train_sizes(cfg) for n in (run.per_rank_batch, last)]
        num_classes, channels_last, _, dtype = shape_args
        run.capture_seconds = run.step.capture(shapes, num_classes, channels_last, dtype)
        run.log(f"{run.variant}: captured {len(run.step.graphs)} CUDA graph(s) of the training step "
                f"in {run.capture_seconds:.1f} s")
    elif run.rt.device.type == "cuda":  # (compiled: the short last batch, which runs eagerly)
        for size in train_sizes(cfg):
            warm_up(t, run.precision, [last] if cfg.compile else [run.per_rank_batch, last], size, *shape_args)
    run.phase = "training"


@contextlib.contextmanager
def _out_of_memory_explained(run: _Run):
    """torch.OutOfMemoryError as one line: what ran, at which shapes, the device's memory, what was
    asked, and what to change. Under ddp the failed rank exits; torchrun's agent then stops the
    others (SIGTERM, SIGKILL after 30 s), so none waits on it in a collective."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        raise FasttrainError(out_of_memory_message(run, e)) from None


def out_of_memory_message(run: _Run, e: BaseException) -> str:
    cfg, rt = run.cfg, run.rt
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(e))
    if rt.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(rt.device)
        memory = f"{rt.device_name} has {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free now)"
    else:
        memory = f"the CPU has {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    per = f" ({run.per_rank_batch} per process)" if rt.world_size > 1 else ""
    change = ("evaluate.batch_size" if run.phase.startswith("evaluation") else
              "train.batch_size, train.img_size" + (", train.progressive_size" if cfg.progressive_epochs else ""))
    half = "" if run.precision.compute_dtype != torch.float32 else ", or a half precision (bf16, amp)"
    return (f"{run.variant}: out of memory in {run.phase}: train.batch_size {cfg.batch_size}{per}, "
            f"img_size {cfg.img_size} px, precision {run.precision.name}; {memory}, and "
            f"{'asked for ' + asked.group(1) if asked else 'asked for more'}: use a smaller {change}{half}")


# torch's words when a schedule steps before its optimizer ever has (LRScheduler.step)
SCHEDULE_FIRST = "Detected call of `lr_scheduler.step()` before `optimizer.step()`"


def _first_schedule_step(run: _Run) -> None:
    """The one-cycle schedule's first step. When GradScaler skipped the run's first step (amp: its
    initial scale, 65536, overflows the fp16 gradients), the optimizer has not stepped yet and torch
    warns as if the calls were out of order; the log says what happened instead, once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.scheduler.step()
    for w in caught:
        if str(w.message).startswith(SCHEDULE_FIRST):
            run.log(f"{run.variant}: GradScaler skipped the first step (its initial scale overflowed the fp16 "
                    f"gradients), so the schedule moved on without it: what torch's warning about calling "
                    f"lr_scheduler.step() before optimizer.step() means here")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _train_epoch(run: _Run, epoch: int, progress: Progress) -> tuple[StepLog, float]:
    """One epoch's steps, timed; the per-step values stay on the device (one host sync per epoch)."""
    loader, optimizer, scheduler, rt = run.train_loader, run.t.optimizer, run.scheduler, run.rt
    loader.set_epoch(epoch)
    run.phase = f"epoch {epoch + 1}"
    if run.cfg.progressive_epochs:  # (the gpu loader: check_train)
        loader.set_img_size(train_size(run.cfg, epoch))
    run.t.net.train()
    steps = StepLog(len(loader), rt.device, run.t.scaler)
    first, seconds_before = run.state.epoch_steps, run.state.epoch_seconds  # resumed mid-epoch, else 0
    if first:
        steps.load_state_dict(run.epoch_log)
        run.state.epoch_steps, run.state.epoch_seconds, run.epoch_log = 0, 0.0, None
    progress.start_epoch(epoch)
    synchronize(rt.device)
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader.iter_from(first), start=first):
        loss, grad_norm = run.step(x, y)
        # copied on the device at once: a .item() per step would stall the GPU queue, and a graph's
        # next replay overwrites its loss; the lr each step used goes to TensorBoard
        steps.record(loss, y.shape[0], grad_norm, optimizer.param_groups[0]["lr"] if run.writer else None)
        if isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR):
            if epoch == step == 0:
                _first_schedule_step(run)
            else:
                scheduler.step()
        progress.step(y.shape[0] * rt.world_size, loss)  # read at once, and only when a refresh is due
        if run.stop.agreed(step + 1, last=step + 1 == len(loader)):  # a host flag; see preemption.py
            break
    synchronize(rt.device)
    seconds = seconds_before + time.perf_counter() - start
    progress.end_epoch()
    return steps, seconds


def _end_epoch(run: _Run, epoch: int, steps: StepLog, seconds: float) -> EpochRecord:
    """Sums over ranks, the non-finite check, the per-step scalars, evaluation and the plateau
    schedule: everything an epoch ends with, after its timed steps."""
    rt, state = run.rt, run.state
    summary = steps.summary()
    totals = torch.tensor([summary["loss_sum"], summary["images"], summary["bad_steps"],
                           summary["skipped_steps"]], dtype=torch.float64, device=rt.device)
    parallel.all_reduce(totals, rt)
    seconds = float(parallel.all_reduce(torch.tensor([seconds], device=rt.device), rt, op="max")[0])
    seen, bad, skip = int(totals[1]), int(totals[2]), int(totals[3])
    if bad and not (run.t.scaler.is_enabled() and bad <= skip):
        _raise_non_finite(run, epoch, summary, bad)
    _write_step_scalars(run, summary)
    state.global_step += steps.steps
    state.skipped_steps += skip
    epoch_loss = float(totals[0]) / max(1, seen - bad * run.per_rank_batch)
    run.phase = f"evaluation after epoch {epoch + 1} (evaluate.batch_size {run.params.evaluate.batch_size})"
    with clock.phase("eval") as evaluation:
        accuracy = evaluate_model(run.t.net, run.test_loader, run.precision, rt, len(run.dataset.classes),
                                  run.params.evaluate.flip_tta).accuracy  # (its counts' all-reduce syncs)
    if isinstance(run.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        run.scheduler.step(epoch_loss)
    record = EpochRecord(epoch + 1, seconds, epoch_loss, accuracy, float(run.t.optimizer.param_groups[0]["lr"]),
                         seen, train_size(run.cfg, epoch), summary["grad_norm_max"], evaluation.seconds)
    state.history.append(record)
    state.epoch = epoch + 1
    return record


def _raise_non_finite(run: _Run, epoch: int, summary: dict, bad: int) -> None:
    """The earliest bad step over all ranks (every rank gets here: `bad` is summed over them)."""
    mine = summary["first_bad_step"]
    earliest = torch.tensor(-mine if mine is not None else torch.iinfo(torch.int64).min,
                            dtype=torch.int64, device=run.rt.device)
    step_no = 1 - int(parallel.all_reduce(earliest, run.rt, op="max"))
    kept = (f"the last good checkpoint is {run.ckpt_path} (epoch {run.saved_epoch})" if run.saved_epoch
            else "no checkpoint of this run was written yet")
    raise FasttrainError(f"{run.variant}: non-finite loss at epoch {epoch + 1}, step {step_no} "
                         f"({bad} step(s)); {kept}")


def _write_step_scalars(run: _Run, summary: dict) -> None:
    """Per-step TensorBoard scalars, from the epoch's log: no sync inside the epoch."""
    if run.writer is None:
        return
    first, every = run.state.global_step, run.params.run.log_every_steps
    for i, loss_value in enumerate(summary["losses"]):
        global_step = first + i + 1
        if global_step % every == 0:
            run.writer.add_scalar("train/loss", loss_value, global_step)
            run.writer.add_scalar("train/lr", summary["lrs"][i], global_step)
            if summary["scales"] is not None:
                run.writer.add_scalar("train/loss_scale", summary["scales"][i], global_step)
            if summary["grad_norms"] is not None:
                run.writer.add_scalar("train/grad_norm", summary["grad_norms"][i], global_step)


def _log_epoch(run: _Run, record: EpochRecord) -> None:
    at = f" at {record.img_size} px" if run.cfg.progressive_epochs else ""
    norm = "" if record.max_grad_norm is None else f"  max grad norm {record.max_grad_norm:.3g}"
    run.log(f"{run.variant}: epoch {record.epoch}/{run.cfg.epochs}{at}  loss {record.train_loss:.4f}  "
            f"test acc {record.test_accuracy:.4f}  {record.seconds:.2f} s  {record.images_per_second:,.0f} img/s{norm}")
    if run.writer is not None:
        run.writer.add_scalar("epoch/train_loss", record.train_loss, record.epoch)
        run.writer.add_scalar("epoch/test_accuracy", record.test_accuracy, record.epoch)
        run.writer.add_scalar("epoch/seconds", record.seconds, record.epoch)
        run.writer.add_scalar("epoch/images_per_second", record.images_per_second, record.epoch)
        run.writer.flush()  # its writer thread's error (a full disk) is raised here, or lost at close()


def _write_progress(run: _Run) -> None:
    """The per-epoch table and the metrics so far, at their final paths, after every epoch: `dvc exp
    show` reads a running experiment's files from its workspace, queued runs' temporary ones too.
    `_finish` overwrites the metrics with the whole set."""
    last = run.state.history[-1]
    atomic.atomic_write_text(run.layout.train_plot(run.variant), _history_csv(run.state.history),
                             "the per-epoch table")
    atomic.atomic_write_json(run.layout.train_metrics(run.variant), {
        "epochs": last.epoch, "train_seconds": round(sum(r.seconds for r in run.state.history), 3),
        "train_loss": round(last.train_loss, 6), "test_accuracy": last.test_accuracy}, "the training metrics")


def _finish(run: _Run, wall_start: float) -> dict:
    """The final model, the per-epoch table, the metrics and the TensorBoard hparams (main process)."""
    rt, cfg = run.rt, run.cfg
    peak, peak_kind = peak_memory_mb(rt)
    peak = float(parallel.all_reduce(torch.tensor([peak], device=rt.device), rt, op="max")[0])
    if rt.is_main:
        with clock.phase("final_model"):
            checkpoint.save({"model": run.t.raw.state_dict(), "config": run.resolved,
                             "classes": run.dataset.classes, "variant": run.variant},
                            run.layout.model(run.variant), "the final model")
    metrics = _metrics(run, peak, peak_kind, time.perf_counter() - wall_start)
    if rt.is_main:
        atomic.atomic_write_text(run.layout.train_plot(run.variant), _history_csv(run.state.history),
                                 "the per-epoch table")
        atomic.write_record(metrics, HEADLINE, run.layout.train_metrics(run.variant),
                     run.layout.train_diagnostics(run.variant), "training")
        hparams = {"parallel": rt.parallel, "precision": run.precision.name, "model": run.params.model.name,
                   "loader": run.params.data.loader, "world_size": rt.world_size, "device": rt.device_name,
                   **{k: v for k, v in config.to_dict(run.cfg).items() if k in HPARAM_KEYS},
                   "grad_clip": cfg.grad_clip or 0.0, "cuda_graphs": isinstance(run.step, graphs.GraphedStep)}
        run.writer.add_hparams(hparams, {f"hparam/{k}": metrics[k] for k in HPARAM_METRICS},
                               run_name=".")  # "." keeps the hparams in the variant's own run folder
        run.writer.flush()
        run.writer.close()
        _drop_checkpoint(run)  # last: an output that fails to be written leaves the run resumable
    parallel.barrier(rt)
    return metrics


# where the process's time goes (clock.phase), in the metrics whether or not the run entered them: a run
# too short to checkpoint reports checkpoints 0.0; the final model's is the main process's
PHASES = ("start_up", "runtime", "prepare", "warm_up", "train", "eval", "checkpoints", "final_model")

# train params shown beside each run in TensorBoard's hparams view, and the metrics shown with them
HPARAM_KEYS = ("batch_size", "lr", "epochs", "img_size", "seed", "scheduler", "channels_last", "space_to_depth",
               "fused_max_pool", "compile", "progressive_epochs", "progressive_size", "adam_beta2", "cycle_momentum",
               "deterministic")
HPARAM_METRICS = ("images_per_second", "epoch_seconds", "peak_memory_mb", "train_loss", "test_accuracy")

# the record's headline figures: metrics/train/<variant>.json, what `dvc metrics show` and `dvc metrics
# diff` print; the rest of it (phases, compile and capture, warnings, lists) is diagnostics/train/
HEADLINE = ("epochs", "train_seconds", "epoch_seconds", "images_per_second", "peak_memory_mb",
            "train_loss", "test_accuracy")


def _save_checkpoint(run: _Run, partial: tuple[StepLog, float] | None = None) -> None:
    """At the end of an epoch, or after `partial`'s steps and seconds of the next one (on a signal):
    then each rank's StepLog so far goes in too, so the resumed epoch sums the same losses."""
    rt, t = run.rt, run.t
    mine = {"rng": rng_state(), "epoch_log": partial[0].state_dict() if partial else None}
    ranks = rt.mode.all_ranks(mine, rt)
    state = _state_to_dict(run.state)
    if partial:
        state["epoch_steps"], state["epoch_seconds"] = partial[0].steps, partial[1]
    if rt.is_main:
        checkpoint.save({
            "model": t.raw.state_dict(), "optimizer": t.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
            "scaler": t.scaler.state_dict(), "state": state, "rng": [r["rng"] for r in ranks],
            "epoch_logs": [r["epoch_log"] for r in ranks], "config": run.resolved, "config_hash": run.digest,
        }, run.ckpt_path)
        _keep_tensorboard(run)
    run.saved_epoch = run.state.epoch
    run.checkpoints_written += 1
    parallel.barrier(rt)  # no rank runs ahead of a checkpoint it might have to resume from


def _drop_checkpoint(run: _Run) -> None:
    """Once the final outputs are written, the variant's checkpoint (an earlier epoch's, ~685 MB for AlexNet
    with AdamW's state) and its TensorBoard copy go: the next `train` would otherwise resume it instead of
    measuring the run again. A checkpoint named with --resume elsewhere is the user's and stays."""
    checkpoint.remove(run.ckpt_path)
    shutil.rmtree(_kept_tensorboard(run), ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: something of the user's, or another run of the variant
        run.ckpt_path.parent.rmdir()
        run.ckpt_path.parent.parent.rmdir()


def _kept_tensorboard(run: _Run) -> Path:
    return run.ckpt_path.parent / "tensorboard"


def _keep_tensorboard(run: _Run) -> None:
    """A copy of the TensorBoard run beside its checkpoint. tensorboard/<variant> is a DVC output, and
    DVC deletes a stage's outputs before running it again, so a run resumed by `dvc repro` would
    otherwise show no curves before its checkpoint (the copy is kilobytes)."""
    run.writer.flush()
    kept = _kept_tensorboard(run)
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(run.layout.tensorboard(run.variant), kept)


def _history_csv(history: list[EpochRecord]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["epoch", "elapsed_seconds", "epoch_seconds", "train_loss", "test_accuracy", "lr", "images_per_second",
                "img_size", "max_grad_norm"])
    elapsed = 0.0
    for r in history:
        elapsed += r.seconds
        w.writerow([r.epoch, f"{elapsed:.3f}", f"{r.seconds:.3f}", f"{r.train_loss:.6f}",
                    "" if r.test_accuracy is None else f"{r.test_accuracy:.6f}", f"{r.lr:.3g}",
                    f"{r.images_per_second:.1f}", "" if r.img_size is None else r.img_size,
                    "" if r.max_grad_norm is None else f"{r.max_grad_norm:.4g}"])
    return out.getvalue()


def _compile_workers() -> int:
    """The processes inductor compiles kernels in (TORCHINDUCTOR_COMPILE_THREADS; 1: in this one)."""
    from torch._inductor import config as inductor_config

    return inductor_config.compile_threads


def _metrics(run: _Run, peak: float, peak_kind: str, wall_seconds: float) -> dict:
    h, cfg, rt, scaler = run.state.history, run.cfg, run.rt, run.t.scaler
    # the first epoch carries warm-up (cudnn autotune, caches); under progressive resizing the steady
    # rate is the one at img_size, the resolution the run is about
    steady = [r for r in h[1:] if r.img_size in (None, cfg.img_size)] or h[1:] or h
    steady_seconds = sum(r.seconds for r in steady) / len(steady)
    steady_ips = sum(r.images for r in steady) / sum(r.seconds for r in steady)
    return {
        "variant": run.variant, "parallel": rt.parallel, "precision": run.precision.name,
        "epochs": len(h),
        "train_seconds": round(sum(r.seconds for r in h), 3),
        "wall_seconds": round(wall_seconds, 3),  # from the start of training (data, model) to the final model
        "process_seconds": clock.report(PHASES),  # this process's wall time by phase, start-up and checkpoints too
        "checkpoints_written": run.checkpoints_written,
        "first_epoch_seconds": round(h[0].seconds, 3),
        "epoch_seconds": round(steady_seconds, 3),
        "epoch_seconds_each": [round(r.seconds, 3) for r in h],
        "images_per_second": round(steady_ips, 1),
        "eval_seconds": round(sum(r.eval_seconds or 0.0 for r in h), 3),  # per-epoch test accuracy, all epochs
        "compile_seconds": round(sum(run.compile_seconds_each.values()), 3) if run.compile_seconds_each else None,
        "compile_seconds_each": {k: round(v, 3) for k, v in run.compile_seconds_each.items()} or None,
        "compile_cache": run.compile_cache,  # graphs found in torch.compile's caches (hit), or compiled (miss)
        "compile_workers": _compile_workers() if cfg.compile else None,
        "cuda_graphs": isinstance(run.step, graphs.GraphedStep),
        "capture_seconds": round(run.capture_seconds, 3) if run.capture_seconds is not None else None,
        "capture_seconds_each": run.step.seconds_each if isinstance(run.step, graphs.GraphedStep) else None,
        "deterministic": cfg.deterministic,
        "peak_memory_mb": round(peak, 1), "peak_memory_kind": peak_kind,
        "train_loss": round(h[-1].train_loss, 6),  # the last epoch's
        "test_accuracy": h[-1].test_accuracy,
        "grad_scaler_skipped_steps": run.state.skipped_steps,
        "grad_scaler_final_scale": scaler.get_scale() if scaler.is_enabled() else None,
        "device": rt.device_name, "device_count": rt.replicas,
        "torch_version": torch.__version__, "world_size": rt.world_size,
        "batch_size": cfg.batch_size, "seed": cfg.seed,
        "warnings": rt.warnings,
    }


@click.command("train")
@variant_options
@click.option("--resume", "resume_path", default=None, type=click.Path(dir_okay=False),
              help="Resume from this checkpoint: an error if it is missing, corrupt, finished or from another "
                   "config. Without it, train resumes the variant's unfinished run of the same params, if any "
                   "(checkpoints/<variant>/<config hash>/last.pt).")
def main(parallel_name: str, precision_name: str, params_path: str, resume_path: str | None) -> None:
    """Train one variant with the `train:` params; writes models/, metrics/train/, plots/train/, tensorboard/."""
    resume = Path(resume_path).resolve() if resume_path else None
    if resume is not None and not resume.is_file():  # before any worker starts
        raise FasttrainError(f"checkpoint not found: {resume_path}")
    run_variant("train", functools.partial(train, resume=resume), parallel_name, precision_name, params_path,
                check=check_train, max_restarts=config.load(params_path).run.max_restarts,
                extra_argv=("--resume", str(resume)) if resume else ())
