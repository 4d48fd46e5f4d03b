"""Train one variant: one loop for every precision and parallel variant.

The loop gets a Runtime (where am I, which rank) and a wrapped model; the precision entry decides
what autocast and the GradScaler do. It never branches on the variant's name.
"""

from __future__ import annotations

import csv
import functools
import io
import random
import shutil
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import torch

from fasttrain import atomic, checkpoint, config, parallel
from fasttrain.data import load_dataset
from fasttrain.errors import FasttrainError
from fasttrain.evaluate import evaluate_model
from fasttrain.layout import Layout
from fasttrain.loaders import make_eval_loader, make_train_loader
from fasttrain.engine import StepLog, build_trainable, input_channels, input_dtype, synchronize, train_step, warm_up
from fasttrain.models import build_model, check_img_size, first_conv
from fasttrain.precision import Precision
from fasttrain.progress import Progress
from fasttrain.variant import run_variant, variant_options


def check_train(params: config.Params, world_size: int) -> None:
    """Everything that can be rejected before a process is started or a file is touched."""
    cfg = params.train
    check_img_size(params.model.name, cfg.img_size)
    if cfg.progressive_epochs:
        if params.data.loader != "gpu":
            raise FasttrainError(f"train.progressive_epochs = {cfg.progressive_epochs} needs data.loader: gpu "
                                 f"(the torchvision loader resizes at one size in its workers): set it to 0 "
                                 f"or use the gpu loader")
        if cfg.progressive_epochs >= cfg.epochs:
            raise FasttrainError(f"train.progressive_epochs = {cfg.progressive_epochs} leaves no epoch at "
                                 f"train.img_size = {cfg.img_size}: use fewer than train.epochs = {cfg.epochs}")
        check_img_size(params.model.name, cfg.progressive_size, "train.progressive_size")
    if cfg.pad_channels:
        if params.data.loader != "gpu":
            raise FasttrainError("train.pad_channels: true needs data.loader: gpu (the torchvision loader "
                                 "gives 3 channels): set it to false or use the gpu loader")
        with torch.device("meta"):
            first_conv(build_model(params.model.name, 10), params.model.name)
    if cfg.batch_size < world_size:
        raise FasttrainError(f"train.batch_size = {cfg.batch_size} is smaller than the {world_size} "
                             f"ddp processes: it is the global batch, so use at least {world_size}")
    if cfg.batch_size % world_size:
        raise FasttrainError(f"train.batch_size = {cfg.batch_size} does not split evenly over "
                             f"{world_size} ddp processes: use a multiple of {world_size}")


def resolved_config(params: config.Params, parallel_name: str, precision_name: str, world_size: int) -> dict:
    """What the run depends on: the params that shape training, plus the variant and the world size."""
    resolved = config.to_dict(params)
    resolved.pop("evaluate")
    # how a run is watched, restarted or checkpointed, not what it computes
    for key in ("log_every_steps", "max_restarts", "checkpoint_every"):
        resolved["train"].pop(key)
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
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def make_scheduler(cfg: config.TrainConfig, optimizer, steps_per_epoch: int):
    if cfg.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=cfg.plateau_factor,
                                                          patience=cfg.plateau_patience)
    if cfg.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, epochs=cfg.epochs,
                                                   steps_per_epoch=steps_per_epoch)
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


def _state_to_dict(state: TrainState) -> dict:
    return {"epoch": state.epoch, "global_step": state.global_step, "skipped_steps": state.skipped_steps,
            "history": [vars(r) for r in state.history]}


def _state_from_dict(d: dict) -> TrainState:
    return TrainState(d["epoch"], d["global_step"], [EpochRecord(**r) for r in d["history"]], d["skipped_steps"])


def checkpoint_to_resume(path: Path, digest: str, rt: parallel.Runtime, explicit: bool) -> dict | None:
    """The training checkpoint to resume from, or None for a fresh run.

    A finished run found in checkpoints/ is not resumed (re-running a stage measures it again), and
    it may come from any config; an unfinished one from another config is refused rather than
    silently thrown away. A checkpoint named with --resume must exist, load and be unfinished.
    """
    if not explicit and not path.exists():
        return None
    ckpt = checkpoint.load(path, map_location=rt.device)  # missing, corrupt, or code in it: an error
    missing = sorted({"optimizer", "scaler", "state", "rng", "config", "config_hash"} - set(ckpt))
    if missing:
        raise FasttrainError(f"{path} is not a training checkpoint (no {', '.join(missing)}): "
                             f"a final model cannot be resumed; use checkpoints/<variant>/last.pt")
    done, planned = ckpt["state"]["epoch"], ckpt["config"]["train"]["epochs"]
    if done >= planned:
        if explicit:
            raise FasttrainError(f"{path} is a finished run ({done} of {planned} epochs): nothing to resume")
        return None
    if ckpt["config_hash"] != digest:
        raise FasttrainError(f"{path} is from another config (hash {ckpt['config_hash']}, now {digest}): "
                             f"delete it to start afresh, or restore the params it was made with")
    return ckpt


def train(params: config.Params, precision: Precision, rt: parallel.Runtime, layout: Layout,
          log=lambda msg: print(msg, file=sys.stderr, flush=True), resume: Path | None = None) -> dict:
    """Train one variant; writes checkpoints, the final model, TensorBoard logs, the per-epoch table
    and the metrics (rank 0 only). Resumes from `resume`, or else from the variant's unfinished
    last checkpoint. Returns the metrics."""
    cfg, variant = params.train, f"{rt.parallel}-{precision.name}"
    if not rt.is_main:
        log = lambda msg: None  # noqa: E731 (one run, one log)
    wall_start = time.perf_counter()
    dataset = load_dataset(layout.dataset)
    resolved = resolved_config(params, rt.parallel, precision.name, rt.world_size)
    digest = config.config_hash(resolved)
    dev = rt.device.type
    torch.backends.cudnn.benchmark = parallel.cudnn_benchmark(cfg.cudnn_benchmark, rt)

    random.seed(cfg.seed)
    trainable = build_trainable(params, precision, rt, len(dataset.classes))
    raw, net, optimizer, scaler = trainable.raw, trainable.net, trainable.optimizer, trainable.scaler
    torch.manual_seed(cfg.seed + 1 + rt.rank)  # dropout differs per rank, as it would on separate data
    per_rank_batch = cfg.batch_size // rt.world_size
    dtype = input_dtype(params, precision)
    channels = input_channels(params)  # of the training batches (pad_channels)
    loader_args = dict(img_size=cfg.img_size, device=rt.device, rank=rt.rank, world_size=rt.world_size,
                       workers=params.data.workers, pin_memory=params.data.pin_memory and dev == "cuda",
                       channels_last=cfg.channels_last, dtype=dtype)
    train_loader = make_train_loader(params.data.loader, dataset.train_images, dataset.train_labels,
                                     batch_size=per_rank_batch, augment=params.data.augment, seed=cfg.seed,
                                     channels=channels, **loader_args)
    test_loader = make_eval_loader(params.data.loader, dataset.test_images, dataset.test_labels,
                                   batch_size=max(1, params.evaluate.batch_size // rt.world_size), **loader_args)
    scheduler = make_scheduler(cfg, optimizer, len(train_loader))

    state = TrainState()
    ckpt_path = layout.checkpoint_dir(variant) / "last.pt"
    resume_from = resume or ckpt_path
    ckpt = checkpoint_to_resume(resume_from, digest, rt, explicit=resume is not None)
    if ckpt is not None:
        raw.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        if scheduler is not None:
            scheduler.load_state_dict(ckpt["scheduler"])
        state = _state_from_dict(ckpt["state"])
        set_rng_state(ckpt["rng"][rt.rank])
        log(f"{variant}: resuming from {resume_from} after epoch {state.epoch}")
    saved_epoch = state.epoch  # the epoch the newest checkpoint of this run holds (0: none yet)

    writer = None
    if rt.is_main:
        from torch.utils.tensorboard import SummaryWriter

        if state.epoch == 0:  # a fresh run: last run's curves would overlay this one's
            shutil.rmtree(layout.tensorboard(variant), ignore_errors=True)
        writer = SummaryWriter(str(layout.tensorboard(variant)), purge_step=state.global_step or None)

    compile_seconds = None
    if cfg.compile:  # compile outside the timed epochs, so the first epoch times training alone
        shapes = [per_rank_batch, train_loader.num_samples % per_rank_batch]
        compile_seconds = sum(warm_up(trainable, precision, shapes, size, len(dataset.classes),
                                      cfg.channels_last, rt.device, dtype, channels) for size in train_sizes(cfg))
        log(f"{variant}: compiled in {compile_seconds:.1f} s")

    progress = Progress(variant, cfg.epochs, len(train_loader), enabled=rt.is_main)
    for epoch in range(state.epoch, cfg.epochs):
        train_loader.set_epoch(epoch)
        size = train_size(cfg, epoch)
        if cfg.progressive_epochs:  # (the gpu loader: check_train)
            train_loader.set_img_size(size)
        net.train()
        steps = StepLog(len(train_loader), rt.device, scaler)
        lrs = []
        progress.start_epoch(epoch)
        synchronize(rt.device)
        start = time.perf_counter()
        for step, (x, y) in enumerate(train_loader):
            parallel.inject_fault(rt, epoch + 1, step + 1)
            loss, grad_norm = train_step(trainable, precision, x, y)
            steps.record(loss, y.shape[0], grad_norm)  # on the device: a .item() per step would stall the GPU queue
            if writer is not None:  # the lr each step used, for its TensorBoard scalar
                lrs.append(optimizer.param_groups[0]["lr"])
            if isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR):
                scheduler.step()
            progress.step(y.shape[0] * rt.world_size, loss)  # reads the loss only when a refresh is due
        synchronize(rt.device)
        seconds = time.perf_counter() - start
        progress.end_epoch()

        summary = steps.summary()
        totals = torch.tensor([summary["loss_sum"], summary["images"], summary["bad_steps"],
                               summary["skipped_steps"]], dtype=torch.float64, device=rt.device)
        parallel.all_reduce(totals, rt)
        seconds_t = parallel.all_reduce(torch.tensor([seconds], device=rt.device), rt, op="max")
        seen, bad, skip = int(totals[1]), int(totals[2]), int(totals[3])
        if bad and not (scaler.is_enabled() and bad <= skip):
            # the earliest bad step over all ranks (every rank gets here: `bad` is summed over them)
            mine = summary["first_bad_step"]
            earliest = torch.tensor(-mine if mine is not None else torch.iinfo(torch.int64).min,
                                    dtype=torch.int64, device=rt.device)
            step_no = 1 - int(parallel.all_reduce(earliest, rt, op="max"))
            kept = (f"the last good checkpoint is {ckpt_path} (epoch {saved_epoch})" if saved_epoch
                    else "no checkpoint of this run was written yet")
            raise FasttrainError(f"{variant}: non-finite loss at epoch {epoch + 1}, step {step_no} "
                                 f"({bad} step(s)); {kept}")
        if writer is not None:  # per-step scalars, written from the epoch's log: no sync inside the epoch
            first = state.global_step
            for i, loss_value in enumerate(summary["losses"]):
                global_step = first + i + 1
                if global_step % cfg.log_every_steps == 0:
                    writer.add_scalar("train/loss", loss_value, global_step)
                    writer.add_scalar("train/lr", lrs[i], global_step)
                    if summary["scales"] is not None:
                        writer.add_scalar("train/loss_scale", summary["scales"][i], global_step)
                    if summary["grad_norms"] is not None:
                        writer.add_scalar("train/grad_norm", summary["grad_norms"][i], global_step)
        state.global_step += steps.steps
        epoch_loss = float(totals[0]) / max(1, seen - bad * per_rank_batch)
        state.skipped_steps += skip

        accuracy = evaluate_model(net, test_loader, precision, rt, len(dataset.classes),
                                  params.evaluate.flip_tta).accuracy
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(epoch_loss)
        record = EpochRecord(epoch + 1, float(seconds_t[0]), epoch_loss, accuracy,
                             optimizer.param_groups[0]["lr"], seen, size, summary["grad_norm_max"])
        state.history.append(record)
        state.epoch = epoch + 1
        at = f" at {size} px" if cfg.progressive_epochs else ""
        norm = "" if record.max_grad_norm is None else f"  max grad norm {record.max_grad_norm:.3g}"
        log(f"{variant}: epoch {record.epoch}/{cfg.epochs}{at}  loss {epoch_loss:.4f}  "
            f"test acc {accuracy:.4f}  {record.seconds:.2f} s  {record.images_per_second:,.0f} img/s{norm}")
        if writer is not None:
            writer.add_scalar("epoch/train_loss", epoch_loss, record.epoch)
            writer.add_scalar("epoch/test_accuracy", accuracy, record.epoch)
            writer.add_scalar("epoch/seconds", record.seconds, record.epoch)
            writer.add_scalar("epoch/images_per_second", record.images_per_second, record.epoch)
        if state.epoch % cfg.checkpoint_every == 0 or state.epoch == cfg.epochs:
            _save_checkpoint(ckpt_path, raw, optimizer, scheduler, scaler, state, resolved, digest, rt)
            saved_epoch = state.epoch

    peak, peak_kind = peak_memory_mb(rt)
    peak = float(parallel.all_reduce(torch.tensor([peak], device=rt.device), rt, op="max")[0])
    metrics = _metrics(state, cfg, rt, precision, variant, peak, peak_kind, scaler,
                       time.perf_counter() - wall_start)
    metrics["compile_seconds"] = None if compile_seconds is None else round(compile_seconds, 3)
    if rt.is_main:
        checkpoint.save({"model": raw.state_dict(), "config": resolved, "classes": dataset.classes,
                         "variant": variant}, layout.model(variant))
        atomic.atomic_write_text(layout.train_plot(variant), _history_csv(state.history))
        atomic.atomic_write_json(layout.train_metrics(variant), metrics)
        writer.add_hparams({"parallel": rt.parallel, "precision": precision.name, "model": params.model.name,
                            "batch_size": cfg.batch_size, "lr": cfg.lr, "epochs": cfg.epochs,
                            "img_size": cfg.img_size, "loader": params.data.loader,
                            "world_size": rt.world_size, "device": rt.device_name, "seed": cfg.seed,
                            "scheduler": cfg.scheduler, "channels_last": cfg.channels_last, "pad_channels": cfg.pad_channels,
                            "compile": cfg.compile,
                            "progressive_epochs": cfg.progressive_epochs, "progressive_size": cfg.progressive_size,
                            "adam_beta2": cfg.adam_beta2, "grad_clip": cfg.grad_clip or 0.0},
                           {"hparam/images_per_second": metrics["images_per_second"],
                            "hparam/epoch_seconds": metrics["epoch_seconds"],
                            "hparam/peak_memory_mb": metrics["peak_memory_mb"],
                            "hparam/final_train_loss": metrics["final_train_loss"],
                            "hparam/final_test_accuracy": metrics["final_test_accuracy"]},
                           run_name=".")  # "." keeps the hparams in the variant's own run folder
        writer.close()
    parallel.barrier(rt)
    return metrics


def _save_checkpoint(path, raw, optimizer, scheduler, scaler, state, resolved, digest, rt) -> None:
    rngs = [None] * rt.world_size
    if rt.distributed:
        torch.distributed.all_gather_object(rngs, rng_state())
    else:
        rngs = [rng_state()]
    if rt.is_main:
        checkpoint.save({
            "model": raw.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict(), "state": _state_to_dict(state), "rng": rngs,
            "config": resolved, "config_hash": digest,
        }, path)
    parallel.barrier(rt)  # no rank runs ahead of a checkpoint it might have to resume from


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


def _metrics(state, cfg, rt, precision, variant, peak, peak_kind, scaler, wall_seconds) -> dict:
    h = state.history
    # the first epoch carries warm-up (cudnn autotune, compile, caches); under progressive resizing
    # the steady rate is the one at img_size, the resolution the run is about
    steady = [r for r in h[1:] if r.img_size in (None, cfg.img_size)] or h[1:] or h
    steady_seconds = sum(r.seconds for r in steady) / len(steady)
    steady_ips = sum(r.images for r in steady) / sum(r.seconds for r in steady)
    return {
        "variant": variant, "parallel": rt.parallel, "precision": precision.name,
        "epochs": len(h),
        "train_seconds": round(sum(r.seconds for r in h), 3),
        "wall_seconds": round(wall_seconds, 3),
        "first_epoch_seconds": round(h[0].seconds, 3),
        "epoch_seconds": round(steady_seconds, 3),
        "epoch_seconds_each": [round(r.seconds, 3) for r in h],
        "images_per_second": round(steady_ips, 1),
        "peak_memory_mb": round(peak, 1), "peak_memory_kind": peak_kind,
        "final_train_loss": round(h[-1].train_loss, 6),
        "final_test_accuracy": h[-1].test_accuracy,
        "grad_scaler_skipped_steps": state.skipped_steps,
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
                   "config. Without it, train resumes from checkpoints/<variant>/last.pt if that run is unfinished.")
def main(parallel_name: str, precision_name: str, params_path: str, resume_path: str | None) -> None:
    """Train one variant with the `train:` params; writes models/, metrics/train/, plots/train/, tensorboard/."""
    resume = Path(resume_path).resolve() if resume_path else None
    if resume is not None and not resume.is_file():  # before any worker starts
        raise FasttrainError(f"checkpoint not found: {resume_path}")
    run_variant("train", functools.partial(train, resume=resume), parallel_name, precision_name, params_path,
                check=check_train, max_restarts=config.load(params_path).train.max_restarts,
                extra_argv=("--resume", str(resume)) if resume else ())
