"""The `fasttrain` process's own exit (cli.run): the exit status and every step of a normal exit, with
the command's objects frozen out of the garbage collector before it. Each case is a real `python -m
fasttrain`-like process, with an atexit handler registered before the command starts (as a
sitecustomize's would be), an object that reports its finalisation, a thread still at work and an
idle thread pool."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, concurrent.futures, gc, sys, threading, time
from fasttrain import cli

class Finalised:
    def __del__(self):
        sys.__stdout__.write("finalised\\n")

keep = Finalised()  # a module global: only the interpreter's teardown collects it
atexit.register(lambda: print(f"atexit ran, {{'some' if gc.get_freeze_count() else 'no'}} objects frozen"))
print("buffered before the command", end="")  # no newline, no flush: still in stdout's buffer
threading.Thread(target=lambda: (time.sleep(0.5), print(" / a thread's last words"))).start()
pool = concurrent.futures.ThreadPoolExecutor(2)  # never shut down, as inductor's compile threads:
pool.submit(time.sleep, 0.1).result()            # its idle worker waits for work until the exit says to end
sys.argv = ["fasttrain", *sys.argv[1:]]
cli.{entry}()
"""


def _fasttrain(entry: str, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout a pipe: block-buffered
    return subprocess.run([sys.executable, "-c", SCRIPT.format(entry=entry), *argv], capture_output=True,
                          text=True, timeout=60, env=env)  # a thread left waiting hangs the exit


@pytest.mark.parametrize("argv, status, stderr", [
    (["--version"], 0, ""),
    (["train", "--parallel", "tpu", "--precision", "fp32"], 2, "fasttrain: error: Invalid value for '--parallel'"),
])
def test_run_exits_with_mains_status_after_every_step_of_a_normal_exit(argv, status, stderr):
    """The status is main's; the other threads finish, an idle pool's workers are told to end (else the
    exit waits for them forever), buffered output is written, a handler registered before run() runs;
    by then the process's objects are frozen, and the teardown's collections skip them (a global's
    finaliser does not run: its memory is the kernel's to free)."""
    proc = _fasttrain("run", *argv)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout.startswith("buffered before the command") and " / a thread's last words\n" in proc.stdout
    assert proc.stdout.endswith("atexit ran, some objects frozen\n"), proc.stdout
    assert stderr in proc.stderr and "Traceback" not in proc.stderr


def test_the_same_process_through_main_freezes_nothing():
    """The control: the same script ending through main() exits with nothing frozen and its global
    finalised, so the case above would see it had run() not frozen the objects."""
    proc = _fasttrain("main", "--version")
    assert proc.returncode == 0 and proc.stdout.endswith("atexit ran, no objects frozen\nfinalised\n"), proc.stdout


def test_a_bug_in_a_command_ends_with_its_traceback_and_status_1():
    proc = subprocess.run([sys.executable, "-c", "import sys; from fasttrain import cli; "
                           "cli.main = lambda: 1 / 0; sys.argv = ['fasttrain']; cli.run()"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
