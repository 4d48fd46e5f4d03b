"""GPU leases: `train.device: auto` takes GPUs that no other fasttrain run holds.

`dvc queue start -j N` starts N experiments at once and gives none of them a GPU of its own; without
a lease every run would pick cuda:0. A lease is an exclusive `flock` on one lock file per GPU, named
by the GPU's UUID (so runs that see the GPUs under different CUDA_VISIBLE_DEVICES still agree), in
$FASTTRAIN_LOCK_DIR or the system's temporary folder. The kernel drops the lock when the process
ends, however it ends, so a crashed run never leaves a GPU taken.

When the GPUs asked for are not all free the run waits, polling, and says so once on stderr; with
FASTTRAIN_LEASE_TIMEOUT=<seconds> it gives up after that long with an error naming the holders
(0: fail at once). A lease of several GPUs is all or nothing, so two multi-GPU runs never deadlock
holding half each.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from fasttrain.errors import FasttrainError

POLL_SECONDS = 2.0


def lock_dir() -> Path:
    return Path(os.environ.get("FASTTRAIN_LOCK_DIR") or tempfile.gettempdir())


def gpu_ids() -> list[str]:
    """One id per visible GPU, in visible order: its UUID, else (no UUID from the driver) its index."""
    ids = []
    for i in range(torch.cuda.device_count()):
        uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "")
        ids.append(f"GPU-{uuid.removeprefix('GPU-')}" if uuid else str(i))
    return ids


@dataclass
class Lease:
    indices: list[int]  # visible indices: cuda:<index> in this process
    ids: list[str]  # the GPUs' UUIDs: what CUDA_VISIBLE_DEVICES accepts in any child process
    files: list  # open lock files; the locks last as long as they stay open

    def release(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


def _lock_path(gpu_id: str) -> Path:
    return lock_dir() / f"fasttrain-gpu-{gpu_id}.lock"


def _open_locked(gpu_id: str):
    """The lock file, open and exclusively locked, or None when another process holds it."""
    path = _lock_path(gpu_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 (held open for the lease's lifetime)
    except OSError as e:
        raise FasttrainError(f"cannot open the GPU lock file {path} ({e.strerror}): set FASTTRAIN_LOCK_DIR "
                             f"to a folder every fasttrain run on this machine can write") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _try_lock(gpu_id: str):
    f = _open_locked(gpu_id)
    if f is not None:
        f.truncate(0)
        f.write(f"pid {os.getpid()}\n")  # for the message of a run that has to wait
        f.flush()
    return f


def _holders(ids: list[str]) -> str:
    held = []
    for gpu_id in ids:
        probe = _open_locked(gpu_id)
        if probe is not None:  # free (again) since the lease attempt
            probe.close()
            continue
        try:
            who = _lock_path(gpu_id).read_text().strip() or "pid ?"
        except OSError:
            who = "pid ?"
        held.append(f"{gpu_id} ({who})")
    return ", ".join(held) or "none now"


def try_acquire(count: int, ids: list[str]) -> Lease | None:
    """The first `count` free GPUs of `ids`, all locked, or None (and nothing locked)."""
    got_indices, got_files = [], []
    for index, gpu_id in enumerate(ids):
        f = _try_lock(gpu_id)
        if f is None:
            continue
        got_indices.append(index)
        got_files.append(f)
        if len(got_indices) == count:
            return Lease(got_indices, [ids[i] for i in got_indices], got_files)
    for f in got_files:
        f.close()
    return None


def acquire(count: int = 1, timeout: float | None = None, stream: TextIO | None = None) -> Lease:
    """Lease `count` of the visible GPUs; wait while they are taken (up to `timeout` seconds, None:
    $FASTTRAIN_LEASE_TIMEOUT, unset: forever)."""
    ids = gpu_ids()
    if count > len(ids):
        raise FasttrainError(f"a lease of {count} GPUs asked for but only {len(ids)} visible")
    if timeout is None and os.environ.get("FASTTRAIN_LEASE_TIMEOUT"):
        timeout = float(os.environ["FASTTRAIN_LEASE_TIMEOUT"])
    start = time.monotonic()
    said = False
    while True:
        lease = try_acquire(count, ids)
        if lease is not None:
            return lease
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            raise FasttrainError(f"no {count} free GPU(s) after {waited:.0f} s: held by other fasttrain runs, "
                                 f"{_holders(ids)}; lock files in {lock_dir()}. Wait, or set train.device "
                                 f"to cuda to share a GPU")
        if not said:
            print(f"fasttrain: waiting for {count} free GPU(s); {len(ids)} visible, held by other fasttrain "
                  f"runs: {_holders(ids)}", file=stream or sys.stderr, flush=True)
            said = True
        time.sleep(POLL_SECONDS)


_held: Lease | None = None
CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20  # <cuda.h>; its value CU_COMPUTEMODE_DEFAULT (0): many processes per GPU


def release_for_exit() -> bool:
    """Ahead of this process's exit, with its work done: gives back its lease, so that the next run
    can start while this process's CUDA context is torn down. True when it may, and also where CUDA
    never started; False, lease kept, where a GPU is in an exclusive compute mode (one context at a
    time: the next run's would fail) or its mode cannot be read."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized() and not _gpus_shared():
        return False
    if _held is not None:
        _held.release()
    return True


def _gpus_shared() -> bool:
    """Every visible GPU is in the default compute mode (the CUDA driver's answer, read through ctypes:
    torch does not expose it)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    for ordinal in range(count.value):
        device, mode = ctypes.c_int(), ctypes.c_int()
        if (cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0
                or cuda.cuDeviceGetAttribute(ctypes.byref(mode), CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, device) != 0
                or mode.value != 0):
            return False
    return True


def hold(count: int, stream: TextIO | None = None) -> Lease:
    """This process's lease, taken once and kept until the process ends. Says which GPUs it holds
    (CUDA index and UUID), so `dvc queue logs` shows each queued run on its own GPU."""
    global _held
    if _held is None:
        _held = acquire(count, stream=stream)
        gpus = ", ".join(f"{i} ({gpu_id})" for i, gpu_id in zip(_held.indices, _held.ids))
        print(f"fasttrain: leased GPU{'s' if count > 1 else ''} {gpus}", file=stream or sys.stderr, flush=True)
    return _held
