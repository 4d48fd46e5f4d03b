"""Test hooks, for the end-to-end tests only: scratch.run puts this folder on PYTHONPATH whenever a
command's environment asks for one of them, so the product's training loop carries none.

- The epoch gate (scratch.epoch_gate; test_live_queue.py, test_resume.py): every `fasttrain train`
  process, however DVC starts it (queued, in a temporary workspace), reports its first epoch's end
  ("<variant> <pid>") to the test's socket at $FASTTRAIN_TEST_EPOCH_SOCKET and waits there until the
  test has looked (or signals it), so "while it runs" is an event, not a guess about timing.
- Faults at a step (the restart, preemption and full-disk tests):
  FASTTRAIN_FAULT_KILL_RANK_AT="<rank>:<epoch>:<step>" makes that rank SIGKILL itself just before
  that 1-based epoch and step, on torchrun's first attempt only; a fourth field "always" kills it
  on every attempt, so the restart budget runs out.
  FASTTRAIN_FAULT_SIGNAL_AT="<SIGNAL>:<rank>:<epoch>:<step>" makes that rank send the signal, just
  before that step, to the process a scheduler would signal: the launcher under `fasttrain train
  --parallel ddp`, else itself.
- A held import (test_serve.py): FASTTRAIN_TEST_HOLD_IMPORT="<module>:<file>" makes `fasttrain serve`
  itself (not the processes it serves) wait, when it imports that module, until <file> exists; it
  writes "<file>.held" when it starts waiting, so "while the server imports" is an event too.
- A slow exit (test_serve.py): FASTTRAIN_TEST_SLOW_EXIT="<seconds>:<file>[:<SIGNAL>]" makes a child
  of `fasttrain serve` spend that long after it has said it is done (its atexit handlers run), as
  a GPU process tearing down its CUDA context does; it then writes <file> (and ends by the signal).

The wraps are applied when fasttrain.train is imported: other Python processes (dvc, celery) are
left alone and pay no torch import.
"""

import atexit
import importlib.abc
import importlib.util
import itertools
import os
import signal
import socket
import sys
import time

SOCKET = os.environ.get("FASTTRAIN_TEST_EPOCH_SOCKET")
KILL_AT = os.environ.get("FASTTRAIN_FAULT_KILL_RANK_AT")
SIGNAL_AT = os.environ.get("FASTTRAIN_FAULT_SIGNAL_AT")
HOLD_IMPORT = os.environ.get("FASTTRAIN_TEST_HOLD_IMPORT")
SLOW_EXIT = os.environ.get("FASTTRAIN_TEST_SLOW_EXIT")


def _gate(module) -> None:
    """`module` is fasttrain.report, whose write_progress train calls after each epoch (main process)."""
    write_progress = module.write_progress  # the metrics so far

    def gated(run):
        write_progress(run)
        if run.state.history[-1].epoch == 1:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(60)
                s.connect(SOCKET)
                s.sendall(f"{run.variant} {os.getpid()}\n".encode())
                # the test's go-ahead (or its end), in short waits: a SIGINT the kernel hands to another
                # thread does not interrupt a blocked recv, and Python raises it only between waits
                s.settimeout(0.1)
                deadline = time.monotonic() + 600  # a test that died must not leave training hung for ever
                while time.monotonic() < deadline:
                    try:
                        s.recv(16)
                        break
                    except TimeoutError:
                        continue

    module.write_progress = gated


def _fault_at(rt, epoch: int, step: int) -> None:
    if KILL_AT:
        rank, at_epoch, at_step, *always = KILL_AT.split(":")
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        at = (int(rank), int(at_epoch), int(at_step))
        if (first_attempt or always == ["always"]) and at == (rt.rank, epoch, step):
            os.kill(os.getpid(), signal.SIGKILL)
    if SIGNAL_AT:
        name, rank, at_epoch, at_step = SIGNAL_AT.split(":")
        if (int(rank), int(at_epoch), int(at_step)) == (rt.rank, epoch, step):
            from fasttrain.parallel import LAUNCHER_PID

            launcher = os.environ.get(LAUNCHER_PID) if rt.distributed else None  # (a worker's, set by launch)
            os.kill(int(launcher) if launcher else os.getpid(), signal.Signals[name])


def _faults(module) -> None:
    """Each epoch's steps counted from the one it starts at (a run resumed mid-epoch starts later),
    the fault checked before each."""
    train_epoch = module._train_epoch

    def faulty(run, epoch, progress):
        step, numbers = run.step, itertools.count(run.state.epoch_steps + 1)

        def counted(x, y):
            _fault_at(run.rt, epoch + 1, next(numbers))
            return step(x, y)

        run.step = counted
        try:
            return train_epoch(run, epoch, progress)
        finally:
            run.step = step

    module._train_epoch = faulty


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fasttrain.train":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            if SOCKET:
                _gate(sys.modules["fasttrain.report"])
            if KILL_AT or SIGNAL_AT:
                _faults(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


if SOCKET or KILL_AT or SIGNAL_AT:
    sys.meta_path.insert(0, _Finder())


class _Hold(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, file: str):
        self.module, self.file = module, file

    def find_spec(self, name, path, target=None):
        if name != self.module or sys.argv[1:2] != ["serve"]:  # (a served child has its own argv)
            return None
        sys.meta_path.remove(self)
        with open(f"{self.file}.held", "w"):
            pass
        deadline = time.monotonic() + 300  # a test that died must not leave the server held for ever
        while not os.path.exists(self.file) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None  # the import goes on as it would have


if HOLD_IMPORT:
    sys.meta_path.insert(0, _Hold(*HOLD_IMPORT.split(":", 1)))


def _slow_exit(seconds: str, file: str, *name: str) -> None:
    """An atexit handler registered before `fasttrain serve` registers its own (server._report_done),
    so it runs after it: in a process forked from this one (a served child) it waits, writes the file,
    then takes the signal, if one is named."""
    if os.getpid() != _imported_by:
        time.sleep(float(seconds))
        with open(file, "w"):
            pass
        if name:
            os.kill(os.getpid(), signal.Signals[name[0]])


_imported_by = os.getpid()
if SLOW_EXIT:
    atexit.register(_slow_exit, *SLOW_EXIT.split(":"))
