"""Train one variant: one loop for every precision and parallel variant.

The loop gets a Runtime (where am I, which rank) and a wrapped model; the precision entry decides
what autocast and the GradScaler do. It never branches on the variant's name.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click
import torch

from fasttrain import checkpoint, clock, config, graphs, parallel, preemption, report, saved, switches
from fasttrain.data import Dataset, load_dataset
from fasttrain.errors import FasttrainError, Preempted
from fasttrain.evaluate import evaluate_model
from fasttrain.kernel_folder import kernel_folder
from fasttrain.layout import Layout
from fasttrain.engine import (StepLog, StepWindows, Trainable, build_trainable, compile_cache_lookups,
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


def make_scheduler(cfg: config.TrainConfig, optimizer, steps_per_epoch: int):
    if cfg.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=cfg.plateau_factor,
                                                          patience=cfg.plateau_patience)
    if cfg.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, epochs=cfg.epochs,
                                                   steps_per_epoch=steps_per_epoch, cycle_momentum=cfg.cycle_momentum)
    return None


@dataclass
class Run:
    """One variant's training run, in three parts: what it is, what it trains with, and how far it is."""
    # what it is
    params: config.Params
    precision: Precision
    rt: parallel.Runtime
    layout: Layout
    log: Callable[[str], None]
    # what it trains with
    dataset: Dataset
    t: Trainable
    train_loader: Loader
    test_loader: Loader
    scheduler: object | None
    step: Callable  # (x, y) -> (loss, grad norm) as device tensors: train_step, or its CUDA graphs
    stop: preemption.StopRequest
    # how far it is
    ckpt: saved.Checkpoints
    state: saved.TrainState = field(default_factory=saved.TrainState)
    phase: str = "the warm-up at the real shapes, before the first epoch"  # where an out-of-memory happened
    warm: report.WarmUp = field(default_factory=report.WarmUp)
    writer: object | None = None  # TensorBoard's SummaryWriter, main process only

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
            with clock.phase("warm_up"), kernel_folder():  # compile, CUDA-graph capture or one eager step at every shape
                _warm_up(run)
            for epoch in range(run.state.epoch, run.cfg.epochs):
                with clock.phase("train"):
                    steps, seconds, windows = _train_epoch(run, epoch, progress)
                whole = steps.steps == len(run.train_loader)  # else stopped mid-epoch by a signal
                if whole:
                    report.log_epoch(run, _end_epoch(run, epoch, steps, seconds, windows))
                # none after the last epoch: the final model is written next, and a finished run is never resumed
                due = stop.stopping or run.state.epoch % run.params.run.checkpoint_every == 0
                if due and run.state.epoch < run.cfg.epochs:
                    with clock.phase("checkpoints"):
                        saved.save(run, None if whole else (steps, seconds))
                if whole and rt.is_main:
                    report.write_progress(run)  # for dvc exp show; after the checkpoint, so a full disk loses no training
                if stop.stopping and run.state.epoch < run.cfg.epochs:
                    raise _preempted(run, epoch, steps.steps if not whole else 0)
        return _finish(run, wall_start)


def _preempted(run: Run, epoch: int, steps: int) -> Preempted:
    at = f"epoch {epoch + 1}, step {steps}" if steps else f"the end of epoch {epoch + 1}"
    again = ("queue the experiment again with the same params" if os.environ.get("DVC_EXP_NAME")
             else "run the same command again")  # DVC names a queued or --temp experiment's run
    return Preempted(f"{run.variant} stopped by {run.stop.name} at {at}; checkpoint {run.ckpt.path}: "
                     f"{again} to resume (exit {preemption.EXIT_PREEMPTED})")


def _prepare(params, precision, rt, layout, log, resume, stop) -> Run:
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
    ckpt = saved.Checkpoints(resolved, digest,
                             layout.checkpoint_dir(f"{rt.parallel}-{precision.name}", digest) / "last.pt")
    run = Run(params, precision, rt, layout, log, dataset, t, train_loader, test_loader,
              make_scheduler(cfg, t.optimizer, len(train_loader)), step, stop, ckpt)
    saved.resume(run, resume)
    if rt.is_main:
        run.writer = report.open_tensorboard(run, resumed_elsewhere=resume is not None)
    return run


def _warm_up(run: Run) -> None:
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
        run.warm.compile_seconds_each = {f"{n}x{size}": s for size, s in each.items()}
        run.warm.compile_cache = compile_cache_lookups(since=before)
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        aot = run.warm.compile_cache["aot_autograd"]
        shapes = ", ".join(f"batch {n} at {size} px {s:.1f} s" for size, s in each.items())
        cached = (f"{aot['hit']} of {sum(aot.values())} graph(s) from the compile cache {cache_dir()}"
                  if sum(aot.values()) else "compiled before in this process")
        run.log(f"{run.variant}: compiled in {sum(each.values()):.1f} s ({shapes}); {cached}")
    if isinstance(run.step, graphs.GraphedStep):
        shapes = [(n, size) for size in train_sizes(cfg) for n in (run.per_rank_batch, last)]
        num_classes, channels_last, _, dtype = shape_args
        run.warm.capture_seconds = run.step.capture(shapes, num_classes, channels_last, dtype)
        run.log(f"{run.variant}: captured {len(run.step.graphs)} CUDA graph(s) of the training step "
                f"in {run.warm.capture_seconds:.1f} s")
    elif run.rt.device.type == "cuda":  # (compiled: the short last batch, which runs eagerly)
        for size in train_sizes(cfg):
            warm_up(t, run.precision, [last] if cfg.compile else [run.per_rank_batch, last], size, *shape_args)
    run.phase = "training"


@contextlib.contextmanager
def _out_of_memory_explained(run: Run):
    """torch.OutOfMemoryError as one line: what ran, at which shapes, the device's memory, what was
    asked, and what to change. Under ddp the failed rank exits; torchrun's agent then stops the
    others (SIGTERM, SIGKILL after 30 s), so none waits on it in a collective."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        raise FasttrainError(out_of_memory_message(run, e)) from None


def out_of_memory_message(run: Run, e: BaseException) -> str:
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


def _first_schedule_step(run: Run) -> None:
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


def _train_epoch(run: Run, epoch: int, progress: Progress) -> tuple[StepLog, float, list[float]]:
    """One epoch's steps, timed, and its windows' images/s; the per-step values stay on the device
    (one host sync per epoch)."""
    loader, optimizer, scheduler, rt = run.train_loader, run.t.optimizer, run.scheduler, run.rt
    loader.set_epoch(epoch)
    run.phase = f"epoch {epoch + 1}"
    if run.cfg.progressive_epochs:  # (the gpu loader: check_train)
        loader.set_img_size(train_size(run.cfg, epoch))
    run.t.net.train()
    steps = StepLog(len(loader), rt.device, run.t.scaler)
    first, seconds_before = run.state.epoch_steps, run.state.epoch_seconds  # resumed mid-epoch, else 0
    if first:
        steps.load_state_dict(run.ckpt.epoch_log)
        run.state.epoch_steps, run.state.epoch_seconds, run.ckpt.epoch_log = 0, 0.0, None
    progress.start_epoch(epoch)
    synchronize(rt.device)
    start = time.perf_counter()
    windows = StepWindows(len(loader) - first, rt.device)
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
        windows.record(y.shape[0] * rt.world_size, step + 1 - first)
        if run.stop.agreed(step + 1, last=step + 1 == len(loader)):  # a host flag; see preemption.py
            break
    synchronize(rt.device)
    seconds = seconds_before + time.perf_counter() - start
    progress.end_epoch()
    return steps, seconds, windows.images_per_second()


def _end_epoch(run: Run, epoch: int, steps: StepLog, seconds: float, windows: list[float]) -> saved.EpochRecord:
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
    report.write_step_scalars(run, summary)
    state.global_step += steps.steps
    state.skipped_steps += skip
    epoch_loss = float(totals[0]) / max(1, seen - bad * run.per_rank_batch)
    run.phase = f"evaluation after epoch {epoch + 1} (evaluate.batch_size {run.params.evaluate.batch_size})"
    with clock.phase("eval") as evaluation:
        accuracy = evaluate_model(run.t.net, run.test_loader, run.precision, rt, len(run.dataset.classes),
                                  run.params.evaluate.flip_tta).accuracy  # (its counts' all-reduce syncs)
    if isinstance(run.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        run.scheduler.step(epoch_loss)
    record = saved.EpochRecord(epoch + 1, seconds, epoch_loss, accuracy, float(run.t.optimizer.param_groups[0]["lr"]),
                         seen, train_size(run.cfg, epoch), summary["grad_norm_max"], evaluation.seconds,
                         [round(r, 1) for r in windows])
    state.history.append(record)
    state.epoch = epoch + 1
    return record


def _raise_non_finite(run: Run, epoch: int, summary: dict, bad: int) -> None:
    """The earliest bad step over all ranks (every rank gets here: `bad` is summed over them)."""
    mine = summary["first_bad_step"]
    earliest = torch.tensor(-mine if mine is not None else torch.iinfo(torch.int64).min,
                            dtype=torch.int64, device=run.rt.device)
    step_no = 1 - int(parallel.all_reduce(earliest, run.rt, op="max"))
    kept = (f"the last good checkpoint is {run.ckpt.path} (epoch {run.ckpt.saved_epoch})" if run.ckpt.saved_epoch
            else "no checkpoint of this run was written yet")
    raise FasttrainError(f"{run.variant}: non-finite loss at epoch {epoch + 1}, step {step_no} "
                         f"({bad} step(s)); {kept}")


def _finish(run: Run, wall_start: float) -> dict:
    """The final model, the per-epoch table, the metrics and the TensorBoard hparams (main process)."""
    rt = run.rt
    peak, peak_kind = report.peak_memory_mb(rt)
    peak = float(parallel.all_reduce(torch.tensor([peak], device=rt.device), rt, op="max")[0])
    if rt.is_main:
        with clock.phase("final_model"):
            checkpoint.save({"model": run.t.raw.state_dict(), "config": run.ckpt.resolved,
                             "classes": run.dataset.classes, "variant": run.variant},
                            run.layout.model(run.variant), "the final model")
    metrics = report.metrics(run, peak, peak_kind, time.perf_counter() - wall_start)
    if rt.is_main:
        report.write_record(run, metrics)
        saved.drop(run)  # last: an output that fails to be written leaves the run resumable
    parallel.barrier(rt)
    return metrics


@click.command("train")
@variant_options
@click.option("--resume", "resume_path", default=None, type=click.Path(dir_okay=False),
              help="Resume from this checkpoint: an error if it is missing, corrupt, finished or from another "
                   "config. Without it, train resumes the variant's unfinished run of the same params, if any "
                   "(checkpoints/<variant>/<config hash>/last.pt).")
def main(parallel_name: str, precision_name: str, seed: int | None, params_path: str, resume_path: str | None) -> None:
    """Train one variant with the `train:` params; writes models/, metrics/train/, plots/train/, tensorboard/."""
    resume = Path(resume_path).resolve() if resume_path else None
    if resume is not None and not resume.is_file():  # before any worker starts
        raise FasttrainError(f"checkpoint not found: {resume_path}")
    run_variant("train", functools.partial(train, resume=resume), parallel_name, precision_name, seed, params_path,
                check=check_train, max_restarts=config.load(params_path).run.max_restarts,
                extra_argv=("--resume", str(resume)) if resume else ())
