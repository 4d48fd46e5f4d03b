"""The `fasttrain` process's own exit (cli.run): the exit status and everything a normal exit does
before the interpreter's teardown, which run() skips. Each case is a real `python -m fasttrain`-like
process, with an atexit handler, an object that reports its finalisation, a thread still at work and an
idle thread pool."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, concurrent.futures, sys, threading, time
from fasttrain import cli

class Finalised:
    def __del__(self):
        sys.__stdout__.write("finalised\\n")

keep = Finalised()  # a module global: only the interpreter's teardown collects it
atexit.register(lambda: print("atexit ran"))
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
def test_run_exits_with_mains_status_after_what_a_normal_exit_does_first(argv, status, stderr):
    """The status is main's; the other threads finish, an idle pool's workers are told to end (else the
    exit waits for them forever), buffered output is written, atexit handlers run; the teardown that
    follows a normal exit (a global's finaliser) does not."""
    proc = _fasttrain("run", *argv)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout.startswith("buffered before the command") and " / a thread's last words\n" in proc.stdout
    assert proc.stdout.endswith("atexit ran\n") and "finalised" not in proc.stdout
    assert stderr in proc.stderr and "Traceback" not in proc.stderr


def test_the_same_process_through_main_is_torn_down_as_usual():
    """The control: the same script ending through main() and a normal exit runs the finaliser, so
    the case above would see it had run() not skipped the teardown."""
    proc = _fasttrain("main", "--version")
    assert proc.returncode == 0 and proc.stdout.endswith("atexit ran\nfinalised\n"), proc.stdout


@pytest.mark.parametrize("code, status", [(None, 0), (3, 3), ("a message", 1)])
def test_exit_codes_map_as_the_interpreters_do(code, status, capsys):
    from fasttrain.cli import _exit_status

    assert _exit_status(code) == status
    assert capsys.readouterr().err == ("a message\n" if status == 1 else "")
