"""What a training run reports, and where: the log line per epoch, TensorBoard (per-step and
per-epoch scalars, the hparams view), the per-epoch table and the metrics so far after every epoch
(`dvc exp show` reads them from a running experiment), and the whole record at the end: headline
figures in metrics/train/, the rest in diagnostics/train/."""

from __future__ import annotations

import contextlib
import csv
import io
import resource
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fasttrain import atomic, clock, config, graphs, parallel, saved
from fasttrain.saved import EpochRecord

if TYPE_CHECKING:
    from fasttrain.train import Run


def peak_memory_mb(rt: parallel.Runtime) -> tuple[float, str]:
    if rt.device.type == "cuda":
        return torch.cuda.max_memory_allocated(rt.device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, "cpu_max_rss"


TENSORBOARD = "the TensorBoard log"


@dataclass
class WarmUp:
    """What compile and capture cost before the first epoch, reported apart from the epochs."""
    compile_seconds_each: dict = field(default_factory=dict)  # "BATCHxPIXELS": seconds (train.compile)
    compile_cache: dict | None = None  # train.compile: the cache lookups (engine.compile_cache_lookups)
    capture_seconds: float | None = None  # train.cuda_graphs


def open_tensorboard(run: Run, resumed_elsewhere: bool) -> GuardedWriter:
    """The variant's TensorBoard writer (main process): a fresh run's folder emptied first, a resumed
    run's curves kept up to its checkpoint (`resumed_elsewhere`: from a checkpoint named with --resume,
    whose curves are not beside it)."""
    from torch.utils.tensorboard import SummaryWriter

    folder = run.layout.tensorboard(run.variant)
    if run.state.epoch == 0:  # a fresh run: last run's curves would overlay this one's
        shutil.rmtree(folder, ignore_errors=True)
    elif not resumed_elsewhere and not folder.exists() and saved.kept_tensorboard(run).is_dir():
        # dvc repro deleted the stage's outputs before resuming it: the run's curves up to its checkpoint
        shutil.copytree(saved.kept_tensorboard(run), folder)
    _take_writer_thread_errors()  # before the writer starts its thread, which may meet a full disk at once
    with tensorboard_call(folder):
        # by its absolute path: its writer thread opens the file afresh for every write, also while
        # warm-up and evaluation run in another folder (kernel_folder); a resumed run drops the steps
        # after its checkpoint (global_step is the last one it keeps)
        writer = SummaryWriter(str(folder.absolute()),
                               purge_step=run.state.global_step + 1 if run.state.global_step else None)
    return GuardedWriter(writer, folder)


class GuardedWriter:
    """TensorBoard's SummaryWriter, whose full disk or refused permission ends as atomic.DiskError's
    one line (tensorboard_call), close() and add_hparams (whose own writer is closed inside) included."""

    def __init__(self, writer, folder: Path):
        _take_writer_thread_errors()
        self._writer, self._folder = writer, folder

    def __getattr__(self, name):
        method = getattr(self._writer, name)

        def guarded(*args, **kwargs):
            with tensorboard_call(self._folder):
                return method(*args, **kwargs)
        return guarded


# TensorBoard's writer thread keeps its OSError (a full disk) for the writer's next call, which raises
# it, but not for close(), which drops it; and the thread raises it too, where threading prints a
# traceback. The hook below takes the thread's OSError instead, and tensorboard_call raises it.
writer_errors: list[OSError] = []  # the writer threads' OSErrors that no call has raised yet
_raised: list[OSError] = []  # those a call raised before the hook had them


@contextlib.contextmanager
def tensorboard_call(folder: Path):
    """A call to TensorBoard's writer: a full disk or refused permission, its own or its writer
    threads' since the last call (writer_errors), ends as atomic.DiskError's one line."""
    with atomic.disk_errors(folder, TENSORBOARD):
        try:
            yield
        except OSError as e:  # TensorBoard raised its thread's error itself: the hook's copy goes
            _raised.append(e)
            writer_errors[:] = [x for x in writer_errors if x is not e]
            raise
        if writer_errors:
            raise writer_errors.pop(0)


def _take_writer_thread_errors() -> None:
    """threading.excepthook, wrapped once: an OSError ending one of TensorBoard's writer threads goes
    to writer_errors, with no traceback; any other thread's exception to the hook it wraps."""
    previous = threading.excepthook
    if getattr(previous, "takes_writer_thread_errors", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            if not any(args.exc_value is e for e in _raised):
                writer_errors.append(args.exc_value)
        else:
            previous(args)

    hook.takes_writer_thread_errors = True
    threading.excepthook = hook


def write_step_scalars(run: Run, summary: dict) -> None:
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


def log_epoch(run: Run, record: EpochRecord) -> None:
    at = f" at {record.img_size} px" if run.cfg.progressive_epochs else ""
    norm = "" if record.max_grad_norm is None else f"  max grad norm {record.max_grad_norm:.3g}"
    run.log(f"{run.variant}: epoch {record.epoch}/{run.cfg.epochs}{at}  loss {record.train_loss:.4f}  "
            f"test acc {record.test_accuracy:.4f}  {record.seconds:.2f} s  {record.images_per_second:,.0f} img/s{norm}")
    if run.writer is not None:
        run.writer.add_scalar("epoch/train_loss", record.train_loss, record.epoch)
        run.writer.add_scalar("epoch/test_accuracy", record.test_accuracy, record.epoch)
        run.writer.add_scalar("epoch/seconds", record.seconds, record.epoch)
        run.writer.add_scalar("epoch/images_per_second", record.images_per_second, record.epoch)
        run.writer.flush()  # its writer thread's error (a full disk) is raised here (GuardedWriter)


def write_progress(run: Run) -> None:
    """The per-epoch table and the metrics so far, at their final paths, after every epoch: `dvc exp
    show` reads a running experiment's files from its workspace, queued runs' temporary ones too.
    `_finish` overwrites the metrics with the whole set."""
    last = run.state.history[-1]
    atomic.atomic_write_text(run.layout.train_plot(run.variant), history_csv(run.state.history),
                             "the per-epoch table")
    atomic.atomic_write_json(run.layout.train_metrics(run.variant), {
        "epochs": last.epoch, "train_seconds": round(sum(r.seconds for r in run.state.history), 3),
        "train_loss": round(last.train_loss, 6), "test_accuracy": last.test_accuracy}, "the training metrics")


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


def history_csv(history: list[EpochRecord]) -> str:
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


def compile_workers() -> int:
    """The processes inductor compiles kernels in (TORCHINDUCTOR_COMPILE_THREADS; 1: in this one)."""
    from torch._inductor import config as inductor_config

    return inductor_config.compile_threads


def speed_samples(history: list[EpochRecord], img_size: int) -> dict:
    """What the interval of a run's speed is computed from (stats.mean_interval): its steady epochs'
    images/s (after the first, at img_size) when it has at least three, else those epochs' windows of
    steps, else, in a run of one epoch, that epoch's windows less its first (the warm-up's)."""
    steady = [r for r in history[1:] if r.img_size in (None, img_size)]
    if len(steady) >= 3:
        return {"kind": "epochs", "images_per_second": [round(r.images_per_second, 1) for r in steady]}
    windows = [w for r in steady for w in r.window_images_per_second or []]
    if not steady and history:
        windows = (history[0].window_images_per_second or [])[1:]
    return {"kind": "windows", "images_per_second": windows}


def metrics(run: Run, peak: float, peak_kind: str, wall_seconds: float) -> dict:
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
        "checkpoints_written": run.ckpt.written,
        "first_epoch_seconds": round(h[0].seconds, 3),
        "epoch_seconds": round(steady_seconds, 3),
        "epoch_seconds_each": [round(r.seconds, 3) for r in h],
        "images_per_second": round(steady_ips, 1),
        "speed_samples": speed_samples(h, cfg.img_size),  # for the interval of images_per_second (compare)
        "eval_seconds": round(sum(r.eval_seconds or 0.0 for r in h), 3),  # per-epoch test accuracy, all epochs
        "compile_seconds": round(sum(run.warm.compile_seconds_each.values()), 3) if run.warm.compile_seconds_each else None,
        "compile_seconds_each": {k: round(v, 3) for k, v in run.warm.compile_seconds_each.items()} or None,
        "compile_cache": run.warm.compile_cache,  # graphs found in torch.compile's caches (hit), or compiled (miss)
        "compile_workers": compile_workers() if cfg.compile else None,
        "cuda_graphs": isinstance(run.step, graphs.GraphedStep),
        "capture_seconds": round(run.warm.capture_seconds, 3) if run.warm.capture_seconds is not None else None,
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


def write_record(run: Run, metrics: dict) -> None:
    """The end of a run (main process): the per-epoch table, the metrics (headline and diagnostics)
    and TensorBoard's hparams view, the writer closed."""
    rt, cfg = run.rt, run.cfg
    atomic.atomic_write_text(run.layout.train_plot(run.variant), history_csv(run.state.history),
                             "the per-epoch table")
    atomic.write_record(metrics, HEADLINE, run.layout.train_metrics(run.variant),
                        run.layout.train_diagnostics(run.variant), "training")
    hparams = {"parallel": rt.parallel, "precision": run.precision.name, "model": run.params.model.name,
               "loader": run.params.data.loader, "world_size": rt.world_size, "device": rt.device_name,
               **{k: v for k, v in config.to_dict(cfg).items() if k in HPARAM_KEYS},
               "grad_clip": cfg.grad_clip or 0.0, "cuda_graphs": isinstance(run.step, graphs.GraphedStep)}
    run.writer.add_hparams(hparams, {f"hparam/{k}": metrics[k] for k in HPARAM_METRICS},
                           run_name=".")  # "." keeps the hparams in the variant's own run folder
    run.writer.flush()
    run.writer.close()
