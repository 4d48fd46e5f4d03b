"""Test hook, put on PYTHONPATH by scratch.epoch_gate (test_live_queue.py, test_resume.py): every `fasttrain train`
process, however DVC starts it (queued, in a temporary workspace), reports its first epoch's end
("<variant> <pid>") to the test's socket at $FASTTRAIN_TEST_EPOCH_SOCKET and waits there until the test has looked (or
signals it), so "while it runs" is an event, not a guess about timing.

The wrap is applied when fasttrain.train is imported: other Python processes (dvc, celery) are left
alone and pay no torch import.
"""

import importlib.abc
import importlib.util
import os
import socket
import sys
import time

SOCKET = os.environ.get("FASTTRAIN_TEST_EPOCH_SOCKET")


def _wrap(module) -> None:
    write_progress = module._write_progress  # the metrics so far, written after each epoch (main process)

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

    module._write_progress = gated


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fasttrain.train":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


if SOCKET:
    sys.meta_path.insert(0, _Finder())
