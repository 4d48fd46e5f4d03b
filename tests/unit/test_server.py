"""fasttrain.server without a server running: which processes it refuses to serve, its wire, a served
process's exit status, and a client that finds no server."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import fasttrain
from fasttrain import server


def _request(**changes) -> dict:
    """The request this very process would send (forward's), with `changes`."""
    request = {"argv": ["fasttrain", "evaluate"], "cwd": os.getcwd(), "env": dict(os.environ), "umask": 0o22,
               "executable": sys.executable, "path": list(sys.path), "flags": list(sys.flags),
               "started": fasttrain.STARTED}
    return request | changes


def test_a_process_like_the_server_is_served():
    assert server.refusal(_request(), {}, dict(os.environ), {}) is None


@pytest.mark.parametrize("name", ["DVC_ROOT", "DVC_STAGE", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT",
                                  "TORCHELASTIC_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                                  "FASTTRAIN_DIST_TIMEOUT", "FASTTRAIN_LAUNCHER_PID", "MAKEFLAGS", "PWD"])
def test_what_dvc_make_and_torchrun_set_per_process_may_differ(name):
    assert server.refusal(_request(env=dict(os.environ, **{name: "7"})), {}, dict(os.environ), {}) is None


@pytest.mark.parametrize("name", ["TORCH_LOGS", "TORCHINDUCTOR_CACHE_DIR", "LD_PRELOAD", "MKL_NUM_THREADS", "HOME"])
def test_any_other_variable_that_differs_is_refused_by_name(name):
    env = dict(os.environ, **{name: "something else"})
    assert server.refusal(_request(env=env), {}, dict(os.environ), {}) == f"environment variable {name} differs from the server's"


def test_a_variable_the_servers_imports_set_may_be_there_or_not(monkeypatch):
    """torch._dynamo sets TORCHINDUCTOR_CACHE_DIR where it is unset: a process started by the command
    lacks it, one started by a served process (a ddp worker) has the imports' value; another value
    is a difference."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    began, added = dict(os.environ), {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_someone"}
    assert server.refusal(_request(), {}, began, added) is None
    assert server.refusal(_request(env=dict(began, **added)), {}, began, added) is None
    assert server.refusal(_request(env=dict(began, TORCHINDUCTOR_CACHE_DIR="/elsewhere")), {}, began, added) \
        == "environment variable TORCHINDUCTOR_CACHE_DIR differs from the server's"


def test_threads_may_be_set_for_the_process_but_not_left_to_the_servers(monkeypatch):
    """A worker's OMP_NUM_THREADS (torchrun's, the launcher's) is the child's; a process without one
    would take torch's default, which the server's setting replaced."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert server.refusal(_request(env=dict(os.environ, OMP_NUM_THREADS="4")), {}, dict(os.environ), {}) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    assert server.refusal(_request(env=env), {}, dict(os.environ), {}) == "environment variable OMP_NUM_THREADS differs from the server's"


def test_a_variable_the_process_lacks_is_refused_too(monkeypatch):
    monkeypatch.setenv("SOME_SETTING", "1")
    env = {k: v for k, v in os.environ.items() if k != "SOME_SETTING"}
    assert server.refusal(_request(env=env), {}, dict(os.environ), {}) == "environment variable SOME_SETTING differs from the server's"


@pytest.mark.parametrize("changes, why", [
    ({"executable": "/usr/bin/python9"}, "Python /usr/bin/python9, the server's is"),
    ({"path": [sys.path[0], "/elsewhere", *sys.path[1:]]}, "sys.path differs from the server's"),
    ({"flags": [1 - f if isinstance(f, int) else f for f in sys.flags]}, "the interpreter's flags differ"),
])
def test_another_interpreter_is_refused(changes, why):
    assert why in server.refusal(_request(**changes), {}, dict(os.environ), {})


def test_sys_path_0_may_differ():
    """The console script has its own folder first, `python -m fasttrain` (torchrun's workers) the
    working folder: the child takes the process's whole sys.path."""
    assert server.refusal(_request(path=["/some/bin", *sys.path[1:]]), {}, dict(os.environ), {}) is None


def test_a_source_file_edited_or_removed_since_the_server_imported_it_is_refused(tmp_path):
    source = tmp_path / "train.py"
    source.write_text("x = 1\n")
    sources = {str(source): source.stat().st_mtime_ns}
    assert server.refusal(_request(), sources, dict(os.environ), {}) is None
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000))
    assert server.refusal(_request(), sources, dict(os.environ), {}) == f"{source} changed since the server started"
    source.unlink()
    assert server.refusal(_request(), sources, dict(os.environ), {}) == f"{source} is gone since the server started"


def test_the_servers_sources_are_its_imported_fasttrain_modules():
    files = server._sources(since_ns=time.time_ns())
    assert server.__file__ in files and fasttrain.__file__ in files
    assert all(os.path.dirname(f) == os.path.dirname(fasttrain.__file__) for f in files)


def test_a_message_and_the_standard_streams_cross_the_wire():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        big = {"env": {f"K{i}": "v" * 100 for i in range(2000)}}  # 200 kB: more than a socket buffer holds
        sender = threading.Thread(target=server._send, args=(a, big, [0, 1, 2]))
        sender.start()
        message, fds = server._receive(b, 3)
        sender.join()
        assert message == big and len(fds) == 3
        assert [os.fstat(fd).st_ino for fd in fds] == [os.fstat(fd).st_ino for fd in (0, 1, 2)]
        for fd in fds:
            os.close(fd)
        server._send(b, {"exit": -15})
        assert server._receive(a) == ({"exit": -15}, [])
        b.close()
        assert server._receive(a) == (None, [])


def test_without_a_server_the_process_runs_by_itself(monkeypatch, tmp_path):
    monkeypatch.delenv(server.SERVER, raising=False)
    assert server.forward(["evaluate"]) is None
    monkeypatch.setenv(server.SERVER, str(tmp_path / "gone"))  # a server that has ended
    assert server.forward(["evaluate"]) is None


@pytest.mark.parametrize("status, returncode", [(0, 0), (3, 3), (-signal.SIGINT, 130),
                                                (-signal.SIGTERM, -signal.SIGTERM), (-signal.SIGKILL, -signal.SIGKILL)])
def test_a_served_process_exits_as_its_child_did(status, returncode):
    """Killed by a signal, it is killed by the same one (a shell, DVC, torchrun see what they would
    have); Ctrl-C's is Python's 130."""
    proc = subprocess.run([sys.executable, "-c", f"from fasttrain import server; server.exit_with({status})"],
                          timeout=60)
    assert proc.returncode == returncode


def test_a_gpu_that_a_forked_process_cannot_use_makes_every_process_run_by_itself(monkeypatch):
    """The probe runs in a child forked from the server, as the served processes are; here (no GPU
    or one) it passes, and with CUDA failing in the child it gives the reason every process hears."""
    import torch

    assert server._cuda_in_a_child() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "ones", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error")))
    assert server._cuda_in_a_child() == "a process forked from the server could not use the GPU"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_the_parent_death_signal_is_one_sigterm_however_often_it_comes():
    """Linux sends the parent-death signal once more for every thread of the dead parent that had
    taken the process over (a server that was importing in a thread); a second SIGTERM would end a
    training without its checkpoint. In a process of its own: the setting outlives the call."""
    code = """if True:
        import ctypes, os, signal
        from fasttrain import server
        got = []
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        server.die_with_parent(os.getppid())
        setting = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(setting))  # PR_GET_PDEATHSIG
        for _ in range(3):
            os.kill(os.getpid(), setting.value)
        print(setting.value, len(got))"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == [str(server.PARENT_DIED), "1"]


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), (75, 75), (256, 0), (-1, 255), (True, 1),
                                          ("a message", None)])
def test_a_served_childs_status_is_its_exit_code_as_the_interpreter_makes_it(monkeypatch, code, status):
    monkeypatch.setattr(server, "_served", True)
    monkeypatch.setattr(server, "_status", None)
    server.finished(code)
    assert server._status == status


def test_a_served_child_done_says_its_pid_and_status_once_and_only_where_it_may(monkeypatch):
    """Its last atexit handler: one line on the server's report pipe; nothing in the server itself,
    for a command that returned no status, or where the GPU lease must be kept to the exit."""
    from fasttrain import lease

    def said(served=True, status=0, lease_given=True) -> bytes:
        read, write = os.pipe()
        monkeypatch.setattr(server, "_served", served)
        monkeypatch.setattr(server, "_status", status)
        monkeypatch.setattr(server, "_report_fd", write)
        monkeypatch.setattr(lease, "release_for_exit", lambda: lease_given)
        server._report_done()
        server._report_done()  # (once: the pipe is closed after the first)
        if server._report_fd is not None:
            os.close(write)
        with os.fdopen(read, "rb") as f:
            return f.read()

    assert said(status=75) == f"{os.getpid()} 75\n".encode()
    assert said(served=False) == said(status=None) == said(lease_given=False) == b""
