"""Where a command's wall time goes: the seconds since the process imported fasttrain, split into
named phases, so a run's metrics say what the user waited for besides training (imports, CUDA and
process-group set-up, data, compile, checkpoints). One clock per process: phases are the process's."""

from __future__ import annotations

import contextlib
import time

import fasttrain

_seconds: dict[str, float] = {}
_begun = False


def since_start() -> float:
    return time.perf_counter() - fasttrain.STARTED


def begin() -> None:
    """A command starts: everything from the process's start to now becomes its `start_up` phase
    (the interpreter, the imports of torch and the command's modules, the command line parsed). A
    second command in the same process (tests call them in-process) restarts the clock at zero."""
    global _begun
    _seconds.clear()
    if _begun:
        fasttrain.STARTED = time.perf_counter()
    _seconds["start_up"] = since_start()
    _begun = True


class Timed:
    """What `phase` yields: the block's own seconds, once it has ended."""
    seconds: float = 0.0


@contextlib.contextmanager
def phase(name: str):
    """Adds the block's seconds to phase `name` (a phase may be entered many times); `with phase(n)
    as timed:` gives them alone, too, as timed.seconds."""
    timed, start = Timed(), time.perf_counter()
    try:
        yield timed
    finally:
        timed.seconds = time.perf_counter() - start
        _seconds[name] = _seconds.get(name, 0.0) + timed.seconds


def seconds(name: str) -> float:
    return _seconds.get(name, 0.0)


def report(phases: tuple[str, ...] = ()) -> dict[str, float]:
    """Each phase's seconds so far, `other` for the rest and `total` for the process so far; the
    phases and `other` add up to `total`. `phases` come first and are there at 0.0 if never entered,
    so every run's metrics have the same keys."""
    total = since_start()
    out = {name: 0.0 for name in phases} | {name: round(s, 3) for name, s in _seconds.items()}
    out["other"] = round(total - sum(_seconds.values()), 3)
    out["total"] = round(total, 3)
    return out
