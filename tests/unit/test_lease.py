"""GPU leases without GPUs: the device count and the GPUs' UUIDs are stand-ins, the locks are real."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from fasttrain import lease, parallel
from fasttrain.errors import FasttrainError

FAKE_GPUS = textwrap.dedent("""
    import torch
    from types import SimpleNamespace
    torch.cuda.device_count = lambda: {n}
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_properties = lambda i: SimpleNamespace(uuid=f"uuid-{{i}}")
""")


@pytest.fixture
def gpus(monkeypatch, tmp_path):
    """Three fake GPUs, lock files in a folder of this test's own, no lease held by the process."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"uuid-{i}"))
    monkeypatch.setenv("FASTTRAIN_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv("FASTTRAIN_LEASE_TIMEOUT", raising=False)
    monkeypatch.setattr(lease, "_held", None)
    monkeypatch.setattr(lease, "POLL_SECONDS", 0.05)
    return tmp_path


def test_two_leases_get_different_gpus_and_a_released_one_is_taken_again(gpus):
    a, b = lease.acquire(1, timeout=0), lease.acquire(1, timeout=0)
    assert (a.indices, b.indices) == ([0], [1])
    assert a.ids == ["GPU-uuid-0"] and (gpus / "fasttrain-gpu-GPU-uuid-0.lock").is_file()
    a.release()
    assert lease.acquire(1, timeout=0).indices == [0]


def test_all_taken_fails_with_the_holders_when_no_wait_is_allowed(gpus):
    held = [lease.acquire(1, timeout=0) for _ in range(3)]
    with pytest.raises(FasttrainError, match=rf"no 1 free GPU.*GPU-uuid-2 \(pid {os.getpid()}\).*{gpus}"):
        lease.acquire(1, timeout=0)
    # the failed attempt took nothing from the holders: all three still held, and one let go is free
    assert lease.try_acquire(1, lease.gpu_ids()) is None
    held[1].release()
    assert lease.acquire(1, timeout=0).indices == [1]


def test_a_lease_of_several_gpus_is_all_or_nothing(gpus):
    first = lease.acquire(2, timeout=0)
    assert first.indices == [0, 1]
    with pytest.raises(FasttrainError):
        lease.acquire(2, timeout=0)  # one GPU is free: it must not stay locked by the failed attempt
    assert lease.acquire(1, timeout=0).indices == [2]
    with pytest.raises(FasttrainError, match="only 3 visible"):
        lease.acquire(4, timeout=0)


def test_a_run_waits_for_a_gpu_and_says_so(gpus, capsys):
    held = [lease.acquire(1, timeout=0) for _ in range(3)]
    threading.Timer(0.3, held[1].release).start()
    start = time.monotonic()
    got = lease.acquire(1, timeout=10)
    assert got.indices == [1] and 0.2 < time.monotonic() - start < 5
    assert "waiting for 1 free GPU(s)" in capsys.readouterr().err


def test_a_timeout_from_the_environment(gpus, monkeypatch):
    monkeypatch.setenv("FASTTRAIN_LEASE_TIMEOUT", "0.2")
    held = [lease.acquire(1, timeout=0) for _ in range(3)]
    outcome = []

    def attempt():  # in a thread: a variable that is not read would wait forever, and fail, not hang
        start = time.monotonic()
        try:
            lease.acquire(1)  # no timeout given: the environment's 0.2 s
        except FasttrainError as e:
            outcome.append((str(e), time.monotonic() - start))

    waiter = threading.Thread(target=attempt, daemon=True)
    waiter.start()
    waiter.join(timeout=lease.POLL_SECONDS + 5)
    assert outcome, "the lease did not give up after FASTTRAIN_LEASE_TIMEOUT"
    message, waited = outcome[0]
    assert message.startswith("no 1 free GPU(s) after") and 0.2 <= waited < lease.POLL_SECONDS + 5
    assert all(h.files for h in held)


def test_leases_across_processes_end_with_the_process(gpus):
    child = subprocess.Popen(
        [sys.executable, "-c", FAKE_GPUS.format(n=3) + textwrap.dedent("""
            import sys
            from fasttrain import lease
            print(lease.hold(1).indices[0], flush=True)
            sys.stdin.read()  # holds the lease until killed
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert child.stdout.readline().strip() == "0"
        mine = lease.acquire(1, timeout=0)
        assert mine.indices == [1]
        child.kill()  # SIGKILL: no cleanup code runs, the kernel drops the lock
        child.wait(timeout=30)
        assert lease.acquire(1, timeout=0).indices == [0]
    finally:
        child.kill()


def test_device_auto_leases_for_single_and_dp_but_cuda_does_not(gpus, capsys):
    other = lease.acquire(1, timeout=0)  # another run holds GPU 0
    assert parallel.resolve_device("auto", lease_gpus=1) == torch.device("cuda", 1)
    assert parallel.resolve_device("auto", lease_gpus=1) == torch.device("cuda", 1)  # held once per process
    assert capsys.readouterr().err == "fasttrain: leased GPU 1 (GPU-uuid-1)\n"  # said once, with the GPU
    assert parallel.resolve_device("cuda", lease_gpus=1) == torch.device("cuda", 0)
    assert parallel.resolve_device("cpu", lease_gpus=1) == torch.device("cpu")
    assert other.indices == [0]


def test_ddp_launcher_leases_its_workers_gpus(gpus, monkeypatch):
    seen = {}
    monkeypatch.setattr("torch.distributed.run.run", lambda args: seen.update(
        visible=os.environ["CUDA_VISIBLE_DEVICES"], nproc=args.nproc_per_node))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test
    for name in (parallel.LAUNCHER_PID, "OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # launch sets them for its workers: restored after
    other = lease.acquire(1, timeout=0)
    parallel.launch(["train"], nproc=2, device="auto")
    assert seen == {"visible": "GPU-uuid-1,GPU-uuid-2", "nproc": "2"}
    assert other.indices == [0]


def test_dp_takes_train_nproc_gpus_that_no_other_run_holds(gpus, monkeypatch, capsys):
    set_to = []
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    other = lease.acquire(1, timeout=0)  # another run holds GPU 0
    rt = parallel.setup("dp", "auto", nproc=2)
    assert (rt.device, rt.device_ids, rt.replicas) == (torch.device("cuda", 1), [1, 2], 2)
    assert capsys.readouterr().err == "fasttrain: leased GPUs 1 (GPU-uuid-1), 2 (GPU-uuid-2)\n"
    assert set_to == [torch.device("cuda", 1)]
    assert other.indices == [0]


def test_dp_without_nproc_spreads_over_every_visible_gpu_and_cuda_does_not_lease(gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    other = lease.acquire(1, timeout=0)
    rt = parallel.setup("dp", "cuda")  # train.device cuda: no lease, the first GPUs
    assert (rt.device, rt.device_ids, rt.replicas) == (torch.device("cuda", 0), [0, 1, 2], 3)
    assert parallel.setup("dp", "cuda", nproc=1).device_ids == [0]
    other.release()
    assert parallel.setup("dp", "auto").device_ids == [0, 1, 2]


def test_dp_asking_for_more_gpus_than_visible_fails_in_one_line(gpus):
    with pytest.raises(FasttrainError, match=r"^train.nproc = 4 GPUs for dp but only 3 GPU\(s\) visible: "
                                            r"set train.nproc to at most 3 or null$"):
        parallel.setup("dp", "auto", nproc=4)
    assert lease.try_acquire(3, lease.gpu_ids()) is not None  # nothing was leased


def test_a_process_done_gives_its_lease_back_before_its_exit_where_the_gpus_take_another(gpus, monkeypatch):
    """server._report_done asks, so that the next stage finds the GPU free while this process's CUDA
    context is torn down; where a GPU takes one context at a time, the lease stays until the exit."""
    lease.hold(1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(lease, "_gpus_shared", lambda: False)
    assert not lease.release_for_exit()
    assert lease.acquire(1, timeout=0).indices == [1]  # GPU 0 still held
    monkeypatch.setattr(lease, "_gpus_shared", lambda: True)
    assert lease.release_for_exit()
    assert lease.acquire(1, timeout=0).indices == [0]


class _FakeDriver:
    """libcuda's three calls that _gpus_shared makes, over GPUs in the given compute modes."""

    def __init__(self, modes):
        self.modes = modes

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.modes)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetAttribute(self, value, attribute, device):
        assert attribute == lease.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
        value._obj.value = self.modes[device.value]
        return 0


@pytest.mark.parametrize("modes, shared", [([0], True), ([0, 0], True), ([0, 3], False), ([1], False), (None, False)],
                         ids=["default", "two default", "one exclusive-process", "exclusive-thread", "no driver"])
def test_gpus_are_shared_only_where_every_one_is_in_the_default_compute_mode(monkeypatch, modes, shared):
    import ctypes

    def cdll(name):
        if modes is None:
            raise OSError(f"{name}: cannot open shared object file")
        return _FakeDriver(modes)

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert lease._gpus_shared() is shared
