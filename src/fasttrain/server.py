"""`fasttrain serve -- COMMAND`: one warm process that the `fasttrain` commands of a pipeline fork from.

Every stage of `dvc repro` is a `fasttrain` process that imports torch and its own modules before it
does anything: about 2 s each on a 2-core CPU and on an H200 host, paid by every train, evaluate
and ddp worker process. `fasttrain serve -- dvc repro` runs the command with $FASTTRAIN_SERVER set
and, meanwhile, imports those modules once (torch._dynamo later, while no process waits). A
`fasttrain` process that the command starts (a stage, torchrun's workers) then hands the server its
arguments, working folder, environment, umask and standard streams, and the server forks a child
that is that command from there on: it parses the arguments, runs and exits as the process itself
would have. The process waits for its child, passes on the signals it gets (Ctrl-C, SIGTERM's
checkpoint) and exits with the child's status, as soon as the child's command has returned and its
atexit handlers have run: the next stage need not wait for the child's teardown (on a GPU, its CUDA
context's), which the server waits for instead. The server ends with the command and its children
and returns the command's exit status.

A process whose interpreter could differ from the server's runs by itself, as without a server,
and says why in one line: another Python executable, sys.path or interpreter flags; an environment
that differs in anything but the variables that DVC, make and torchrun set per process and the
per-run FASTTRAIN_ settings; or a fasttrain source file edited since the server imported it. The
server never initialises CUDA itself (a forked child could not use it then); a probe child checks,
once, that a process forked from it can use the GPU, and if not, every process runs by itself.

Standard library only on the client's side (`forward`): a served process imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import io
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fasttrain
from fasttrain.errors import FasttrainError

SERVER = "FASTTRAIN_SERVER"  # the server's socket, set for the command it runs
# What the served commands import, once, before the first is served: the stages' modules.
PRELOAD = ("fasttrain.train", "fasttrain.evaluate", "fasttrain.download", "torch.utils.tensorboard",
           "torch.distributed.run")
# And, once serving, while no process waits: torch._dynamo, which only some processes import (a ddp
# worker's DistributedDataParallel(), train.compile), about 2 s on a 2-core CPU that the first stage
# should not wait for. A child forked before imports it itself if it needs it. It is imported in a
# thread, and a new process waits for it to end. Not inductor: importing torch._inductor.compile_fx
# started the CUDA driver (cuInit) on an H100 host (torch 2.11), and no process forked after that can
# use the GPU. The server checks after each import, with a probe child.
LATER = ("torch._dynamo",)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# What may differ between the server's environment and a served process's: what DVC, make and
# torchrun set per process (a worker's rank, its GPUs, its threads), and fasttrain's per-run settings,
# all read when a command runs, none while the server imports.
PER_PROCESS = {"PWD", "OLDPWD", "SHLVL", "_", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKE_TERMOUT", "MAKE_TERMERR",
               "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
               "PYTHONUNBUFFERED", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
PER_PROCESS_PREFIXES = ("DVC_", "TORCHELASTIC_", "MASTER_", "GROUP_", "ROLE_", "FASTTRAIN_")
PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>
PARENT_DIED = getattr(signal, "SIGRTMIN", 34) + 1  # the parent-death signal (die_with_parent): one no one else sends
LAUNCHER_PID = "FASTTRAIN_LAUNCHER_PID"  # set by the ddp launcher (parallel.launch) for its workers
_served = False  # this process is a server's child
_report_fd: int | None = None  # in a server's child: the pipe on which it tells the server it is done
_status: int | None = None  # in a server's child: the exit status of its command, once that has returned
_registered = False  # _report_done is an atexit handler of this process


class Forked(BaseException):
    """Raised in a server's child, out of `serve` and the click command that called it, so that
    cli.run runs the served command in a process that has left the server's frames behind."""

    def __init__(self, argv: list[str]):
        super().__init__()
        self.argv = argv


def served() -> bool:
    """This process is a server's child: its parent is the server, the process it serves is the
    one that started it (parallel.die_with_launcher asks)."""
    return _served


def finished(code: object) -> None:
    """In a server's child: its command has returned, and the process exits with `code` (as sys.exit
    takes it; one that Python would print, a string, is left to the exit itself)."""
    global _status
    if _served and (code is None or isinstance(code, int)):
        _status = (code or 0) & 0xFF


def _report_done() -> None:
    """A server's child, done: its last atexit handler (`serve` registers it before its imports, so it
    runs after every other one, those of the command included) tells the server the command's exit
    status, and the server gives it to the served process at once, which exits with it while this
    process is torn down: the interpreter's teardown and, on a GPU, the CUDA context's, 0.4 s after
    the last atexit handler on an H100 host. The output is flushed first and the GPU lease given back
    (lease.release_for_exit), so the next stage finds the GPU free. Nothing is said where the command
    did not return a status (an exception of its own: the exit prints it) or the GPUs may not take a
    second process while this one holds its context; then the server reports the exit as it comes."""
    global _report_fd
    if not _served or _status is None or _report_fd is None:
        return
    lease = sys.modules.get("fasttrain.lease")
    if lease is not None and not lease.release_for_exit():
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except (OSError, ValueError):  # (the exit reports what a failed flush makes of the status)
        return
    with contextlib.suppress(OSError):
        os.write(_report_fd, f"{os.getpid()} {_status}\n".encode())
        os.close(_report_fd)
    _report_fd = None


def die_with_parent(parent: int) -> None:
    """SIGTERM to this process when its parent dies, even by SIGKILL; at once if it died already
    (its parent is no longer `parent`). Once: Linux sends the parent-death signal again whenever a
    thread of the dead parent that took the process over ends too, and a second SIGTERM would end a
    training at once, without its checkpoint (preemption); so the kernel sends PARENT_DIED, which
    raises SIGTERM the first time only. Linux only (prctl); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    signal.signal(PARENT_DIED, _parent_died)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, PARENT_DIED)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _parent_died(signum, frame) -> None:
    signal.signal(signum, signal.SIG_IGN)
    signal.raise_signal(signal.SIGTERM)


# The wire: each side sends length-prefixed JSON messages; the request carries the client's
# standard streams as file descriptors (SCM_RIGHTS).

def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    framed = struct.pack("!I", len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [framed], fds)
        if sent < len(framed):  # (not an empty send: the server may have answered and closed by now)
            sock.sendall(framed[sent:])
    else:
        sock.sendall(framed)


def _receive(sock: socket.socket, nfds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) when the other side closed."""
    buffer, fds = b"", []
    while len(buffer) < 4 or len(buffer) < 4 + struct.unpack("!I", buffer[:4])[0]:
        if nfds and not fds:
            chunk, fds, _, _ = socket.recv_fds(sock, 1 << 16, nfds)
        else:
            chunk = sock.recv(1 << 16)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        buffer += chunk
    return json.loads(buffer[4:]), fds


# The client: a `fasttrain` process that finds $FASTTRAIN_SERVER.

def forward(args: list[str]) -> int | None:
    """Hands this command to the server of $FASTTRAIN_SERVER and relays it: the exit status to exit
    with (-N: killed by signal N), or None to run it here (no server, or it refused, saying why)."""
    path = os.environ.get(SERVER)
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # the server has ended (its command is over) or never started
        sock.close()
        return None
    with sock:
        umask = os.umask(0)
        os.umask(umask)
        try:
            _send(sock, {"argv": [sys.argv[0], *args], "cwd": os.getcwd(), "env": dict(os.environ),
                         "umask": umask, "executable": sys.executable, "path": sys.path, "flags": list(sys.flags),
                         "started": fasttrain.STARTED}, [0, 1, 2])
            reply, _ = _receive(sock)
        except OSError as e:
            reply = {"refused": f"the server did not answer: {e.strerror or e}"}
        if reply is None:  # it ended with its command in the meantime
            return None
        if "refused" in reply:
            print(f"fasttrain: not served ({reply['refused']}): running by itself", file=sys.stderr)
            return None
        child = reply["pid"]
        if LAUNCHER_PID in os.environ:  # a ddp worker: its launcher's death ends it (parallel.die_with_launcher)
            die_with_parent(int(os.environ[LAUNCHER_PID]))
        previous = {s: signal.signal(s, lambda signum, frame: _pass_on(child, signum)) for s in FORWARDED}
        try:
            reply, _ = _receive(sock)
        except OSError:  # the server went away (killed): its children went with it
            reply = None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if reply is None:
        print("fasttrain: error: the server ended before the command it ran did", file=sys.stderr)
        return 1
    return reply["exit"]


def _pass_on(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signum)


def exit_with(status: int) -> None:
    """Exit as the served child did: its exit code, or the same signal (SIGINT as Python's 130)."""
    if status < 0:
        signum = -status
        if signum != signal.SIGINT:
            if signum != signal.SIGKILL:  # (whose handler cannot be set)
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        status = 128 + signum
    sys.exit(status)


# The server.

def refusal(request: dict, sources: dict[str, int], environ: dict[str, str], added: dict[str, str]) -> str | None:
    """Why this process may not be forked from the server: its interpreter or environment could
    differ from the one the server imported with: `environ`, the server's before its imports, and
    `added`, what those imports set (a process started by a served one has those too). None: it may."""
    if os.path.realpath(request["executable"]) != os.path.realpath(sys.executable):
        return f"Python {request['executable']}, the server's is {sys.executable}"
    if request["path"][1:] != sys.path[1:]:
        return "sys.path differs from the server's (PYTHONPATH, the environment)"
    if request["flags"] != list(sys.flags):
        return "the interpreter's flags differ from the server's"
    env = request["env"]
    differ = sorted(k for k in set(env) | set(environ)
                    if env.get(k) not in (environ.get(k), added.get(k, environ.get(k)))
                    and k != SERVER and k not in PER_PROCESS and not k.startswith(PER_PROCESS_PREFIXES))
    if "OMP_NUM_THREADS" in environ and "OMP_NUM_THREADS" not in env:  # (the child sets the one it is given)
        differ.insert(0, "OMP_NUM_THREADS")
    if differ:
        return f"environment variable {differ[0]} differs from the server's"
    for file, mtime in sources.items():
        try:
            if os.stat(file).st_mtime_ns != mtime:
                return f"{file} changed since the server started"
        except OSError:
            return f"{file} is gone since the server started"
    return None


def _sources(since_ns: int) -> dict[str, int]:
    """Every fasttrain module the server has imported, by file, with its modification time; -1 for
    one modified after `since_ns` (time.time_ns() before the imports), which may have changed after
    it was imported."""
    package = Path(fasttrain.__file__).parent
    files = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).parent == package:
            mtime = os.stat(file).st_mtime_ns
            files[file] = mtime if mtime < since_ns else -1
    return files


def serve(command: list[str], preload: tuple[str, ...] = PRELOAD, later: tuple[str, ...] = LATER) -> int:
    """Runs `command` with $FASTTRAIN_SERVER set and serves the `fasttrain` processes it starts
    until it ends; its exit status (128 + N if signal N ended it). In a child: raises Forked."""
    if not command:
        raise FasttrainError("serve needs a command to run, e.g. fasttrain serve -- dvc repro")
    try:
        folder = tempfile.mkdtemp(prefix="fasttrain-serve-")
    except OSError as e:
        raise FasttrainError(f"serve: cannot make a folder for its socket in {tempfile.gettempdir()}: "
                             f"{e.strerror}; set TMPDIR to a writable folder") from None
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            listener.bind(path)
        except OSError as e:  # (an AF_UNIX path is at most 107 bytes: a long TMPDIR)
            raise FasttrainError(f"serve: cannot make its socket {path}: {e}; set TMPDIR to a shorter folder") from None
        listener.listen(64)
        try:
            proc = subprocess.Popen(command, env=dict(os.environ, **{SERVER: path}))
        except OSError as e:
            raise FasttrainError(f"serve: cannot run {command[0]!r}: {e.strerror}") from None
    except FasttrainError:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    # Ctrl-C reaches the command and its processes from the terminal: the server waits for them to
    # stop. SIGTERM and SIGHUP sent to the server go to the command.
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, frame: _pass_on(proc.pid, signum))
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    previous_wakeup = signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the loop (set_wakeup_fd)
    report_read, report_write = os.pipe()  # children say here that they are done (_report_done)
    os.set_blocking(report_read, False)
    global _registered
    if not _registered:  # before the imports: the children's last atexit handler
        atexit.register(_report_done)
        _registered = True
    imported, environ = time.time_ns(), dict(os.environ)
    refused_all = _preload(preload)
    sources = _sources(since_ns=imported)
    imports = _Imports(refused_all, sources, environ, _added(environ))
    later = [] if refused_all else list(later)
    gc.freeze()  # the children's collections leave the imported objects alone: their pages stay shared
    server = os.getpid()
    children: dict[int, socket.socket] = {}  # pid -> the connection of the process it serves
    finishing: dict[int, int] = {}  # pid -> the status it reported: its process has it, it exits
    reports = bytearray()  # what the report pipe gave so far ("<pid> <status>\n" each)
    pipes = (wake_read, wake_write, report_read, report_write)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(report_read, selectors.EVENT_READ)

    importing: threading.Thread | None = None  # importing the next of `later` while the loop serves on
    imported_why: list[str | None] = []

    while proc.poll() is None or children or finishing:
        events = selector.select(timeout=0 if later and importing is None else 1.0)
        for key, _ in events:
            if key.fileobj is listener and proc.poll() is None:
                conn, _ = listener.accept()
                pid = _fork_for(conn, imports, listener, selector, children, pipes)
                if pid is not None:
                    selector.register(conn, selectors.EVENT_READ)
                    children[pid] = conn
            elif key.fileobj is wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
            elif key.fileobj is report_read:
                with contextlib.suppress(BlockingIOError):
                    reports += os.read(report_read, 4096)
                *lines, rest = reports.split(b"\n")
                reports = bytearray(rest)
                for line in lines:
                    pid, status = map(int, line.split())
                    if pid in children:  # (not yet reaped)
                        conn = children.pop(pid)
                        _answer(conn, status, selector)
                        finishing[pid] = status
            elif key.fileobj is not listener:  # a served process ended or was killed: end its child
                pid = next((p for p, c in children.items() if c is key.fileobj), None)
                if pid is not None:  # (None: answered in this round already)
                    selector.unregister(key.fileobj)
                    _pass_on(pid, signal.SIGTERM)
        for pid, status in list(finishing.items()):
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                del finishing[pid]
                if os.waitstatus_to_exitcode(wait_status) != status:
                    print(f"fasttrain: warning: process {pid} had finished its command with exit status {status}, "
                          f"then its exit ended it {_how(os.waitstatus_to_exitcode(wait_status))}", file=sys.stderr)
        for pid, conn in list(children.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                _answer(conn, os.waitstatus_to_exitcode(status), selector)
                del children[pid]
        if importing is not None and not importing.is_alive():  # imported: forks again, from here
            importing.join()
            importing = None
            if imported_why.pop() is None:
                imports = dataclasses.replace(imports, refused_all=_cuda_checked(), added=_added(environ))
                later = later if imports.refused_all is None else []
                gc.freeze()
            if listener.fileno() != -1:
                selector.register(listener, selectors.EVENT_READ)
        if later and importing is None and not events and proc.poll() is None:  # no process waits
            # One more import, in a thread, so that the loop still ends the child of a process that
            # is killed meanwhile. No fork until it is done: a child would inherit the import's locks
            # half-held. The connections wait in the listener's backlog.
            selector.unregister(listener)
            importing = threading.Thread(target=_import_in_thread, args=(later.pop(0), imported_why, wake_write),
                                         name="fasttrain-serve-import", daemon=True)
            importing.start()
        if proc.poll() is not None and listener.fileno() != -1:  # no new processes once the command is over
            with contextlib.suppress(KeyError):  # (not registered while a thread imports)
                selector.unregister(listener)
            listener.close()
    if importing is not None:  # the command ended while a thread imported: the interpreter exits after it
        importing.join()
    assert os.getpid() == server
    signal.set_wakeup_fd(previous_wakeup)
    for s, handler in previous.items():
        signal.signal(s, handler)
    for fd in pipes:
        os.close(fd)
    selector.close()
    shutil.rmtree(folder, ignore_errors=True)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _answer(conn: socket.socket, status: int, selector) -> None:
    """The served process's answer, its exit status, and the end of its connection."""
    with contextlib.suppress(OSError):
        _send(conn, {"exit": status})
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(conn)
    conn.close()


def _how(status: int) -> str:
    if status >= 0:
        return f"with exit status {status}"
    with contextlib.suppress(ValueError):
        return f"by signal {signal.Signals(-status).name}"
    return f"by signal {-status}"


def _preload(modules: tuple[str, ...]) -> str | None:
    """Imports what the served commands import; why every process must run by itself if it cannot."""
    for name in modules:
        if why := _import(name):
            return why
    return _cuda_checked()


def _import_in_thread(name: str, why: list[str | None], wake: int) -> None:
    """`_import(name)`, in a thread beside the serving loop: appends why it failed (None: it did not)
    to `why`, then wakes the loop through its pipe."""
    why.append(_import(name))
    with contextlib.suppress(BlockingIOError):
        os.write(wake, b"\0")


def _import(name: str) -> str | None:
    import importlib

    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 (an import that fails: each process then meets it itself)
        return f"the server could not import {name}: {type(e).__name__}"
    return None


def _added(environ: dict[str, str]) -> dict[str, str]:
    """What the server's imports set in its environment, as they would have in a served process's
    (torch._dynamo: TORCHINDUCTOR_CACHE_DIR)."""
    return {k: v for k, v in os.environ.items() if environ.get(k) != v}


def _cuda_checked() -> str | None:
    """After imports: why no process forked from the server could use the GPU now, or None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a forked child could not use CUDA
        return "the server initialised CUDA while it imported"
    return _cuda_in_a_child()


def _cuda_in_a_child(timeout: float = 60.0) -> str | None:
    """Whether a process forked from the server can use the GPU, as the served ones must: a probe
    child tries (the server itself never initialises CUDA). None if it can, or if there is no GPU;
    else why every process must run by itself."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    pid = os.fork()
    if pid == 0:  # the probe: it only reports, by its exit status, and leaves as a forked helper does
        code = 0
        try:
            if torch.cuda.is_available():
                torch.ones(1, device="cuda").add_(1).item()
        except BaseException:  # noqa: BLE001 (whatever CUDA raises in a forked process)
            code = 1
        os._exit(code)
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "a process forked from the server did not get the GPU within a minute"
        time.sleep(0.01)
    if os.waitstatus_to_exitcode(done[1]) != 0:
        return "a process forked from the server could not use the GPU"
    return None


@dataclasses.dataclass(frozen=True)
class _Imports:
    """What the server's imports left: why no process may be served (None: they may), the fasttrain
    sources imported and their times, the environment before them and what they added to it."""
    refused_all: str | None
    sources: dict[str, int]
    environ: dict[str, str]
    added: dict[str, str]


def _fork_for(conn, imports: _Imports, listener, selector, children, pipes) -> int | None:
    """Reads a request from `conn` and forks its child: the child's pid, or None (refused, or the
    process went away). In the child: raises Forked, the server's resources closed."""
    conn.settimeout(10.0)
    try:
        request, fds = _receive(conn, 3)
    except (OSError, ValueError):
        request, fds = None, []
    if request is None or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    why = imports.refused_all or refusal(request, imports.sources, imports.environ, imports.added)
    if why:
        with contextlib.suppress(OSError):
            _send(conn, {"refused": why})
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _become(request, imports.added, fds, [listener, conn, *children.values()], selector, pipes)
        raise Forked(request["argv"][1:])
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    try:
        _send(conn, {"pid": pid})
    except OSError:  # the process is gone already: so goes its child
        _pass_on(pid, signal.SIGTERM)
    return pid


def _become(request: dict, added: dict[str, str], fds: list[int], sockets: list[socket.socket], selector,
            pipes: tuple[int, int, int, int]) -> None:
    """In the child: leave the server behind and take the served process's place (streams, folder,
    environment, umask, arguments, clock), as that process would have been after its own imports."""
    global _served, _report_fd
    _served = True
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    selector.close()
    for sock in sockets:
        sock.close()
    wake_read, wake_write, report_read, report_write = pipes
    for fd in (wake_read, wake_write, report_read):
        os.close(fd)
    _report_fd = report_write  # (_report_done)
    os.setpgid(0, 0)  # the terminal's Ctrl-C reaches the served process, which passes it on: once
    die_with_parent(os.getppid())  # a server killed outright (the OOM killer) takes its children along
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(added)  # (the served process's environment is the server's as it began: the same imports add the same)
    sys.argv = request["argv"]
    sys.path[:] = request["path"]
    _reopen_standard_streams(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    fasttrain.STARTED = request["started"]  # perf_counter is the host's monotonic clock: the same in both
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _reopen_standard_streams(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on the served process's descriptors, buffered as Python would have
    made them there: line by line on a terminal (stderr always), write-through when unbuffered."""
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding=encoding, errors=errors)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=encoding,
                                  errors="backslashreplace" if fd == 2 else errors,
                                  line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _command():
    import click

    @click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
    def main(command: tuple[str, ...]) -> None:
        """Run COMMAND (`dvc repro`, `dvc exp run`, make ...) with one warm process that its fasttrain
        commands fork from, instead of each importing torch: `fasttrain serve -- dvc repro`. Exits with
        COMMAND's status."""
        sys.exit(serve(list(command)))

    return main


main = _command()
