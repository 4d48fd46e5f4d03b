"""The developer scripts that carry GPU work: they run where no test can watch them, so their
contract is checked here on the CPU."""

import os
import re
import subprocess
import sys
import time

import pytest
from scratch import REPO

DETACHED = str(REPO / "scripts" / "detached.sh")


def detached(*args, out=None, timeout=60):
    env = {**os.environ, **({"OUT": str(out)} if out else {})}
    return subprocess.run(["bash", DETACHED, *map(str, args)], capture_output=True, text=True, env=env, check=False,
                          timeout=timeout)


def test_detached_run_outlives_its_call_and_a_later_call_collects_it(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "go"
    script = f"echo started; while [ ! -e {flag} ]; do sleep 0.1; done; echo result > {run_dir}/out/r.txt; exit 3"

    first = detached(run_dir, 1, "--", "bash", "-c", script, out=out)
    assert first.returncode == 75, first.stdout + first.stderr  # still running when the call ends
    assert "started" in first.stdout and "still running" in first.stdout
    assert not (run_dir / "rc").exists() and list(out.iterdir()) == []

    again = detached(run_dir, 1, "--", "echo", "a second command", out=out)  # never starts another
    assert again.returncode == 75 and "already holds a run" in again.stdout

    flag.touch()
    done = detached(run_dir, 30, out=out)
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own exit status
    assert "ended with exit status 3" in done.stdout
    assert (out / "r.txt").read_text() == "result\n"
    assert "a second command" not in (run_dir / "log").read_text()


def test_detached_says_when_its_run_is_gone_or_was_never_started(tmp_path):
    never = detached(tmp_path / "none", 1)
    assert never.returncode == 2 and "no run in" in never.stderr

    run_dir = tmp_path / "run"
    started = detached(run_dir, 0, "--", "sleep", "60")
    assert started.returncode == 75
    pid = int((run_dir / "pid").read_text())
    os.killpg(os.getpgid(pid), 9)  # the machine was given back, say: the run and its session die
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["kill", "-0", str(pid)], check=False).returncode == 0:
        time.sleep(0.1)
    gone = detached(run_dir, 1)
    assert gone.returncode == 1 and "gone without an exit status" in gone.stderr


@pytest.mark.slow
def test_kernel_sass_counts_the_loader_kernel_for_hopper():
    """Triton's compiler and ptxas, from the torch wheel's triton: no GPU needed."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_sass.py")], capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"(\d+) instructions per thread, 768 output values per program of 128 threads: "
                      r"([\d.]+) thread-instructions per output value \(sm_90\)", proc.stdout)
    assert found, proc.stdout
    count, per_value = int(found[1]), float(found[2])
    assert count > 0 and per_value == pytest.approx(count * 128 / 768, abs=0.05)


def test_kernel_sass_counts_the_padded_tile_form():
    """train.pad_channels' output: 8 channels a pixel (3 of the image, 5 zero), one tile per program."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_sass.py"), "--channels", "8"],
                          capture_output=True, check=False, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"(\d+) instructions per thread, 2048 output values per program of 128 threads: "
                      r"([\d.]+) thread-instructions per output value \(sm_90\)", proc.stdout)
    assert found, proc.stdout
    assert int(found[1]) > 0 and float(found[2]) == pytest.approx(int(found[1]) * 128 / 2048, abs=0.05)
