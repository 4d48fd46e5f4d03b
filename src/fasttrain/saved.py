"""What a training run saves and restores, in one place: the checkpoint a run writes and resumes from
(model, optimizer, scheduler, scaler, progress, every rank's RNG and partial epoch), which checkpoint
to resume, and the in-memory snapshot that warm-up and CUDA-graph capture put back, so that neither
changes training."""

from __future__ import annotations

import contextlib
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fasttrain import checkpoint, parallel
from fasttrain.errors import FasttrainError

if TYPE_CHECKING:
    from fasttrain.engine import StepLog, Trainable
    from fasttrain.train import Run


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
    window_images_per_second: list[float] | None = None  # its windows of steps (engine.StepWindows), all processes' images

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


@dataclass
class Checkpoints:
    """A run's checkpoint: the params it is of, where it lives, and what this process did with it."""
    resolved: dict  # the resolved config, saved with it and compared on resume
    digest: str  # its hash, which names the checkpoint's folder
    path: Path  # checkpoints/<variant>/<digest>/last.pt
    saved_epoch: int = 0  # the epoch the newest checkpoint of this run holds (0: none yet)
    written: int = 0  # by this process
    epoch_log: dict | None = None  # this rank's StepLog of the unfinished epoch it resumed (TrainState.epoch_steps)


@dataclass
class TrainState:
    """Everything a checkpoint restores; the rest of a run is re-derived from params."""
    epoch: int = 0  # epochs completed
    global_step: int = 0
    history: list[EpochRecord] = field(default_factory=list)
    skipped_steps: int = 0
    epoch_steps: int = 0  # steps done of epoch `epoch` + 1 (a checkpoint written on SIGTERM, mid-epoch)
    epoch_seconds: float = 0.0  # and the seconds they took


def state_to_dict(state: TrainState) -> dict:
    return {"epoch": state.epoch, "global_step": state.global_step, "skipped_steps": state.skipped_steps,
            "history": [vars(r) for r in state.history], "epoch_steps": state.epoch_steps,
            "epoch_seconds": state.epoch_seconds}


def state_from_dict(d: dict) -> TrainState:
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


def resume(run: Run, resume: Path | None) -> None:
    mine = run.ckpt
    resume_from = resume or mine.path
    ckpt = checkpoint_to_resume(resume_from, mine.digest, explicit=resume is not None, resolved=mine.resolved)
    if ckpt is None:
        others = sorted(p.parent for p in mine.path.parent.parent.glob("*/last.pt") if p != mine.path)
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
    run.state = state_from_dict(ckpt["state"])
    mine.saved_epoch = run.state.epoch
    set_rng_state(ckpt["rng"][run.rt.rank])
    if run.state.epoch_steps:
        mine.epoch_log = ckpt["epoch_logs"][run.rt.rank]
    mid = f" and {run.state.epoch_steps} step(s) of epoch {run.state.epoch + 1}" if run.state.epoch_steps else ""
    run.log(f"{run.variant}: resuming from {resume_from} after epoch {run.state.epoch}{mid}")


def save(run: Run, partial: tuple[StepLog, float] | None = None) -> None:
    """At the end of an epoch, or after `partial`'s steps and seconds of the next one (on a signal):
    then each rank's StepLog so far goes in too, so the resumed epoch sums the same losses."""
    rt, t = run.rt, run.t
    mine = {"rng": rng_state(), "epoch_log": partial[0].state_dict() if partial else None}
    ranks = rt.mode.all_ranks(mine, rt)
    state = state_to_dict(run.state)
    if partial:
        state["epoch_steps"], state["epoch_seconds"] = partial[0].steps, partial[1]
    if rt.is_main:
        checkpoint.save({
            "model": t.raw.state_dict(), "optimizer": t.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
            "scaler": t.scaler.state_dict(), "state": state, "rng": [r["rng"] for r in ranks],
            "epoch_logs": [r["epoch_log"] for r in ranks], "config": run.ckpt.resolved,
            "config_hash": run.ckpt.digest,
        }, run.ckpt.path)
        keep_tensorboard(run)
    run.ckpt.saved_epoch = run.state.epoch
    run.ckpt.written += 1
    parallel.barrier(rt)  # no rank runs ahead of a checkpoint it might have to resume from


def drop(run: Run) -> None:
    """Once the final outputs are written, the variant's checkpoint (an earlier epoch's, ~685 MB for AlexNet
    with AdamW's state) and its TensorBoard copy go: the next `train` would otherwise resume it instead of
    measuring the run again. A checkpoint named with --resume elsewhere is the user's and stays."""
    checkpoint.remove(run.ckpt.path)
    shutil.rmtree(kept_tensorboard(run), ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: something of the user's, or another run of the variant
        run.ckpt.path.parent.rmdir()
        run.ckpt.path.parent.parent.rmdir()


def kept_tensorboard(run: Run) -> Path:
    return run.ckpt.path.parent / "tensorboard"


def keep_tensorboard(run: Run) -> None:
    """A copy of the TensorBoard run beside its checkpoint. tensorboard/<variant> is a DVC output, and
    DVC deletes a stage's outputs before running it again, so a run resumed by `dvc repro` would
    otherwise show no curves before its checkpoint (the copy is kilobytes)."""
    run.writer.flush()
    kept = kept_tensorboard(run)
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(run.layout.tensorboard(run.variant), kept)


def snapshot(t: Trainable, weights: bool = True) -> dict:
    """Host copies of what a warm-up changes, to be put back into the same tensors (CUDA graphs hold
    their addresses) by `restore`: the buffers (BatchNorm's statistics) and the RNG; with `weights`,
    for warm-up steps that step the optimizer (GraphedStep.capture), the parameters, AdamW's state and
    GradScaler's scale too."""
    kept = {"buffers": [b.detach().to("cpu", copy=True) for b in t.raw.buffers()], "rng": rng_state()}
    if weights:
        kept["params"] = [p.detach().to("cpu", copy=True) for p in t.raw.parameters()]
        kept["optimizer"] = {p: {k: v.detach().to("cpu", copy=True) for k, v in s.items() if isinstance(v, torch.Tensor)}
                             for p, s in t.optimizer.state.items()}
        kept["scaler"] = t.scaler.state_dict() if t.scaler.is_enabled() else None
    return kept


@torch.no_grad()
def restore(t: Trainable, kept: dict) -> None:
    """Everything `snapshot` kept, back into the tensors it came from."""
    for b, v in zip(t.raw.buffers(), kept["buffers"], strict=True):
        b.copy_(v)
    if "params" in kept:
        for p, v in zip(t.raw.parameters(), kept["params"], strict=True):
            p.copy_(v)
        for p, state in t.optimizer.state.items():
            before = kept["optimizer"].get(p)
            for k, v in state.items():
                if isinstance(v, torch.Tensor):  # AdamW's fresh state is all zeros (moments, step count)
                    v.copy_(before[k]) if before is not None else v.zero_()
        if kept["scaler"] is not None:  # the tensors it made lazily stay; their values go back
            t.scaler._scale.fill_(kept["scaler"]["scale"])
            t.scaler._growth_tracker.fill_(kept["scaler"]["_growth_tracker"])
    set_rng_state(kept["rng"])
