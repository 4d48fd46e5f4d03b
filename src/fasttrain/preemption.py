"""SIGTERM and SIGUSR1 (a scheduler's preemption, SLURM's `--signal`): stop soon, lose no step.

The handler only sets a host-side flag; the training loop reads it after each step, so the step in
flight finishes, a checkpoint is written at that step (mid-epoch if need be) and the run exits with
EXIT_PREEMPTED, which a scheduler can requeue on. A second signal ends the process at once (the
default action), for a run stuck where the flag is never read.

Under ddp every rank must stop after the same step, or one would wait forever in a collective the
others left. The signal reaches the ranks at different steps (torchrun's agent forwards it to each
worker in turn), so they agree with one all-reduce (max) of the flag, but only every
AGREE_EVERY_STEPS steps and at an epoch's last step, and on the CPU over gloo: a CUDA tensor's
all-reduce read on the host would sync the GPU queue every time, and the loop keeps to one host
sync per epoch. A one-integer gloo all-reduce between local processes is tens of microseconds of
host time, overlapped with the GPU work already queued; every 4 steps it is well under 1% of an
AlexNet step. The price: a ddp run stops up to AGREE_EVERY_STEPS - 1 steps after the signal (none
is lost: the checkpoint is at the step they agreed on).
"""

from __future__ import annotations

import contextlib
import signal

import torch
import torch.distributed as dist

from fasttrain import parallel

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): "try again later"; the checkpoint is at the step it stopped
AGREE_EVERY_STEPS = 4


class StopRequest:
    """Set by SIGTERM/SIGUSR1; `agreed(step, last)` says, identically on every rank, whether to stop
    after this step."""

    def __init__(self, rt: parallel.Runtime):
        self.rt = rt
        self.signal: signal.Signals | None = None  # the first one received, on this rank
        self.stopping = False  # agreed by every rank
        self._group = None
        if rt.distributed:  # a gloo group, so the flag's all-reduce stays on the host (see above)
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:  # the second one: stop now
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signal = signal.Signals(signum)

    def agreed(self, step: int, last: bool = False) -> bool:
        """After 1-based step `step` of an epoch (`last`: its final one)."""
        if not self.rt.distributed:
            self.stopping = self.signal is not None
        elif last or step % AGREE_EVERY_STEPS == 0:
            flag = torch.tensor([int(self.signal is not None)], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            self.stopping = bool(flag[0])
        return self.stopping

    @property
    def name(self) -> str:
        """The signal that stopped the run (another rank's, if this one received none)."""
        return self.signal.name if self.signal is not None else "a signal to another rank"


@contextlib.contextmanager
def stop_on_signals(rt: parallel.Runtime):
    """A StopRequest whose handler holds SIGTERM and SIGUSR1 while the block runs."""
    request = StopRequest(rt)
    previous = {s: signal.signal(s, request._handle) for s in STOP_SIGNALS}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
