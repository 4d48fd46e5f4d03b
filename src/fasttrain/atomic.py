"""Atomic writes: a crash mid-write never replaces a good file with a partial one.

No torch here, so light stages (compare) start fast.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from fasttrain.errors import FasttrainError


# A full disk, a quota, a refused permission, a read-only filesystem: the machine's fault, told in one line.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG})


def disk_error(e: BaseException) -> OSError | None:
    """The OSError of DISK_ERRORS behind `e`, if any: torch.save reports a failed write as a
    RuntimeError of its zip writer, with the OSError as its context."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRORS:
            return e
        e = e.__cause__ or e.__context__
    return None


def free_space(path: Path) -> str:
    """Free space on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2**20:,.1f} MB free"
    except OSError:
        return "free space unknown"


class DiskError(FasttrainError):
    """Writing an output failed for want of space or permission: one line, naming it."""


@contextlib.contextmanager
def disk_errors(path: Path, what: str, verb: str = "write"):
    """Turns a full disk or a refused permission while writing (or, verb "remove", removing) `what` at
    `path` into one line."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (torch.save wraps the OSError in a RuntimeError)
        os_error = disk_error(e)
        if os_error is None:
            raise
        why = f"{os_error.strerror} (errno {errno.errorcode.get(os_error.errno, os_error.errno)})"
        if verb == "remove":
            raise DiskError(f"could not remove {what} {path}: {why}") from None
        raise DiskError(f"could not write {what} to {path}: {why}; {free_space(path)} there; "
                        f"earlier files are unchanged") from None


def atomic_write(path: Path, write: Callable[[BinaryIO], object], what: str = "a file") -> None:
    """`write(f)` into a temporary file in the same folder, flush + fsync, then os.replace: the old
    file or the new one, never a partial one, under `path`. A full disk or a refused permission is
    a one-line DiskError naming `what`, `path` and the free space; the temporary file is removed."""
    path = Path(path)
    with disk_errors(path, what):
        _atomic_write(path, write)


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=_TEMPORARY_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes it 0600; give it a normal file's mode
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


_TEMPORARY_SUFFIX = ".tmp"


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_temporaries(path: Path) -> None:
    """What writes of `path` killed mid-way (SIGKILL, power cut) left: its `.<name>.*.tmp` siblings."""
    for stale in path.parent.glob(f"{glob.escape(_temporary_prefix(path))}*{_TEMPORARY_SUFFIX}"):
        stale.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes, what: str = "a file") -> None:
    atomic_write(path, lambda f: f.write(data), what)


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it, so put it straight back
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str, what: str = "a file") -> None:
    atomic_write_bytes(path, text.encode(), what)


def atomic_write_json(path: Path, obj, what: str = "a file") -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", what)


def write_record(record: dict, headline: tuple[str, ...], metrics: Path, diagnostics: Path, what: str) -> None:
    """A stage's record in two files: its headline figures, a DVC metric, and the rest, an output that
    is not one (read by compare, scripts and people looking into a run). The diagnostics go first: a
    metrics file whose diagnostics are missing is never left."""
    atomic_write_json(diagnostics, {k: v for k, v in record.items() if k not in headline}, f"the {what} diagnostics")
    atomic_write_json(metrics, {k: record[k] for k in headline}, f"the {what} metrics")
