"""Checkpoints: written atomically, loaded with weights_only=True so a file can hold data, never code."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from fasttrain.atomic import atomic_write, disk_errors, remove_temporaries
from fasttrain.errors import FasttrainError


def save(obj, path: Path, what: str = "a training checkpoint") -> None:
    """Atomically, through a `.<name>.*.tmp` sibling. A SIGKILL or power cut mid-write can leave such
    a temporary file behind (never a partial file under the real name); the next save of the same
    path removes it. One writer per path is assumed: rank 0 of the one run of a variant. A full
    disk or a refused permission is a one-line DiskError naming `what`."""
    path = Path(path)
    with disk_errors(path, what):
        remove_temporaries(path)
    atomic_write(path, lambda f: torch.save(obj, f), what)  # streamed: no in-memory copy of the whole file


def remove(path: Path, what: str = "a finished run's checkpoint") -> None:
    """The checkpoint at `path`, if any, and any temporary file an interrupted save of it left."""
    path = Path(path)
    with disk_errors(path, what, verb="remove"):
        remove_temporaries(path)
        path.unlink(missing_ok=True)


def load(path: Path, map_location="cpu", mmap: bool = False) -> dict:
    """torch.load with weights_only=True: a checkpoint can hold tensors and plain data, never code.
    With mmap (map_location "cpu") the tensors stay in the file, read only when used: what a
    checkpoint holds besides its tensors costs milliseconds to read, not a pass over the file."""
    path = Path(path)
    if not path.is_file():
        raise FasttrainError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FasttrainError(f"{path} is refused by torch.load(weights_only=True), not a fasttrain checkpoint: {first}") from None
    except Exception as e:  # noqa: BLE001 (junk bytes fail as anything: EOFError, KeyError, zip errors, ...)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FasttrainError(f"{path} is not a readable checkpoint (truncated or corrupt?): {first}") from None
    if not isinstance(obj, dict) or "model" not in obj:
        raise FasttrainError(f"{path} is not a fasttrain checkpoint: no 'model' state_dict in it")
    return obj
