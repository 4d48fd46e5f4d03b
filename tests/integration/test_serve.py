"""`fasttrain serve -- COMMAND`, with real processes: every fasttrain process the command starts (the
stages, the ddp launcher, torchrun's workers) is forked from the server and gets the results a
process of its own gets; one the server may not serve runs by itself and says why; signals reach
the served command (SIGTERM's checkpoint) and the server ends with the command, leaving nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scratch import BIN, REPO, alive, checkpoint_file, copy_repo, epoch_gate, run, set_params, TINY, wait_until
from test_imports import PROBE, imported

pytestmark = pytest.mark.slow

COMMANDS = (["download"],
            ["train", "--parallel", "single", "--precision", "fp32"],
            ["evaluate", "--parallel", "single", "--precision", "fp32"],
            ["train", "--parallel", "ddp", "--precision", "fp32"],
            ["evaluate", "--parallel", "ddp", "--precision", "fp32"])


def _script(commands) -> str:
    return " && ".join("fasttrain " + " ".join(c) for c in commands)


def _weights(repo: Path, variant: str) -> dict[str, torch.Tensor]:
    return torch.load(repo / "models" / "seed0" / f"{variant}.pt", weights_only=True)["model"]


def test_every_fasttrain_process_forks_from_the_server_with_the_results_of_its_own(tmp_path):
    plain, served = (copy_repo(tmp_path / name) for name in ("plain", "served"))
    folder = tmp_path / "modules"
    folder.mkdir()
    for repo in (plain, served):
        set_params(repo, TINY)
    run(["sh", "-c", _script(COMMANDS)], plain)
    env = {"FASTTRAIN_TEST_MODULES": str(folder),
           "PYTHONPATH": os.pathsep.join([str(PROBE), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = run(["fasttrain", "serve", "--", "sh", "-c", _script(COMMANDS)], served, env=env)
    assert "not served" not in proc.stderr, proc.stderr

    processes = {argv: modules for argv, modules in imported(folder).items() if "fasttrain" in modules}
    servers = [a for a in processes if " serve -- " in a]
    assert len(servers) == 1 and "torch" in processes[servers[0]]
    # Each command's own process (a client: no torch) and the server's child that ran it (torch).
    # ddp: the launcher and 2 workers, each a client and a child.
    for command, count in zip(COMMANDS, (1, 1, 1, 3, 3)):
        line = " ".join(command)
        ran = [modules for argv, modules in processes.items() if argv.partition(" ")[2].startswith(line)
               and " serve -- " not in argv]
        assert len(ran) == 2 * count, (line, sorted(processes))
        assert sum("torch" in modules for modules in ran) == count, line

    for variant in ("single-fp32", "ddp-fp32"):
        a, b = _weights(plain, variant), _weights(served, variant)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), variant
        for kind in ("train", "eval"):
            path = Path("metrics") / kind / "seed0" / f"{variant}.json"
            first, second = ((repo / path).read_text() for repo in (plain, served))
            assert _accuracies(first) == _accuracies(second), path


def _accuracies(text: str) -> dict:
    return {k: v for k, v in json.loads(text).items() if "acc" in k or "loss" in k}


def test_a_process_the_server_may_not_serve_runs_by_itself_and_says_why(tiny_repo):
    proc = run(["fasttrain", "serve", "--", "env", "SOME_SETTING=1", "fasttrain", "download"], tiny_repo)
    assert ("fasttrain: not served (environment variable SOME_SETTING differs from the server's): "
            "running by itself") in proc.stderr
    assert (tiny_repo / "data" / "dataset.pt").is_file()
    # The server's own code, edited while it serves (after a first process, which it served): the
    # next process runs the new code, by itself.
    env = {"PYTHONPATH": os.pathsep.join([str(tiny_repo / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = run(["fasttrain", "serve", "--", "sh", "-c",
                "fasttrain download && touch src/fasttrain/download.py && fasttrain download"], tiny_repo, env=env)
    assert proc.stderr.count("not served") == 1, proc.stderr
    assert f"not served ({tiny_repo / 'src' / 'fasttrain' / 'download.py'} changed since the server started)" \
        in proc.stderr


def test_the_compiler_is_imported_while_the_server_waits_and_its_variable_is_no_difference(tiny_repo, tmp_path):
    """The first process is served before the server imports torch's compiler (server.LATER); once
    no process waits, the server imports it, and the children forked later have it. torch._dynamo
    sets TORCHINDUCTOR_CACHE_DIR where it is unset, as in any process that imports it: a served
    process is compared with the server's environment as it began, and still served."""
    folder = tmp_path / "modules"
    folder.mkdir()
    env = {"FASTTRAIN_TEST_MODULES": str(folder),
           "PYTHONPATH": os.pathsep.join([str(PROBE), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    again = ("fasttrain download && for i in $(seq 60); do sleep 1; fasttrain download || exit 1; "
             "grep -qx torch._dynamo $FASTTRAIN_TEST_MODULES/*.txt && exit 0; done; exit 9")
    proc = run(["env", "-u", "TORCHINDUCTOR_CACHE_DIR", "fasttrain", "serve", "--", "sh", "-c", again],
               tiny_repo, env=env)
    assert "not served" not in proc.stderr, proc.stderr
    children = sorted((int(argv.rpartition("(")[2].rstrip(")")), modules) for argv, modules in imported(folder).items()
                      if "torch" in modules and " serve -- " not in argv)
    assert len(children) >= 2
    assert "torch._dynamo" not in children[0][1] and "torch._dynamo" in children[-1][1]


def test_the_served_commands_status_and_error_line_are_its_own(tiny_repo):
    proc = run(["fasttrain", "serve", "--", "fasttrain", "evaluate", "--parallel", "single", "--precision", "fp32"],
               tiny_repo, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("fasttrain: error: models/seed0/single-fp32.pt not found")
    assert run(["fasttrain", "serve", "--", "sh", "-c", "exit 3"], tiny_repo, check=False).returncode == 3


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "SIGKILL to the server"])
def test_a_signal_to_the_served_process_reaches_its_child_which_checkpoints(tiny_repo, tmp_path, how):
    """SIGTERM to the process DVC started: passed on, the child checkpoints and exits 75, and so does
    the process. SIGKILL, which nothing can pass on (`dvc queue stop --kill`): the server sees the
    process go and sends its child SIGTERM, as a ddp launcher's death does to its workers. Either way
    the server ends with its command and leaves no process behind. The server itself killed outright
    (the OOM killer): its child gets SIGTERM too, and the served process says the server is gone.
    All of it while the server imports torch._dynamo (server.LATER), held there until the child has
    ended: the import does not keep the server from its processes."""
    set_params(tiny_repo, {"train": {"epochs": 3}})
    run(["fasttrain", "download"], tiny_repo)
    pid_file, imported_file = tiny_repo / "client.pid", tmp_path / "imported"
    with epoch_gate() as (env, gate):
        env = {**env, "FASTTRAIN_TEST_HOLD_IMPORT": f"torch._dynamo:{imported_file}"}
        script = f"{_script([COMMANDS[1]])} & echo $! > {pid_file}; wait $!"
        serve = subprocess.Popen([BIN / "fasttrain", "serve", "--", "sh", "-c", script], cwd=tiny_repo,
                                 env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **env},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = gate.accept()
            with conn:
                child = int(conn.recv(100).decode().split()[1])  # the training process: the server's child
                client = int(pid_file.read_text())
                assert child != client and _parent(child) == serve.pid
                wait_until(lambda: Path(f"{imported_file}.held").exists(), "the server to import")
                if how == "SIGKILL to the server":
                    os.kill(serve.pid, signal.SIGKILL)
                else:
                    os.kill(client, signal.Signals[how])
            wait_until(lambda: not alive(child), "the child to end")  # stopped, or (wrongly) trained to the end
        finally:
            imported_file.touch()  # the server's import goes on
        if how == "SIGKILL to the server":
            serve.wait(timeout=60)
            out, err = serve.communicate(timeout=120)  # (its output: the pipes close with the last writer)
            assert "fasttrain: error: the server ended before the command it ran did" in err, err
        else:
            out, err = serve.communicate(timeout=120)
            assert serve.returncode == (75 if how == "SIGTERM" else 128 + signal.SIGKILL), err
    assert "stopped by SIGTERM" in err and checkpoint_file(tiny_repo, "single-fp32").is_file()


def test_the_served_process_ends_with_its_childs_status_while_the_child_is_torn_down(tmp_path):
    """A served process exits with its command's status once its child's atexit handlers have run,
    while the child's teardown (a GPU's context, 0.4 s on an H100 host) goes on; the server waits for
    it before it ends, and says so where the teardown ended the child otherwise."""
    torn_down = tmp_path / "torn_down"
    script = (f"fasttrain --help > /dev/null; echo $?; test -e {torn_down} && echo torn down; "
              f"fasttrain bogus; echo $?; date +%s.%N")
    for how in ("", ":SIGKILL"):
        torn_down.unlink(missing_ok=True)
        proc = run(["fasttrain", "serve", "--", "sh", "-c", script], tmp_path,
                   env={"FASTTRAIN_TEST_SLOW_EXIT": f"3:{torn_down}{how}"})
        *statuses, returned = proc.stdout.split()
        assert statuses == ["0", "2"], proc.stdout  # not "torn down": the first process had ended before
        assert "No such command 'bogus'" in proc.stderr
        assert torn_down.exists() and torn_down.stat().st_mtime > float(returned), "serve ended before its children"
        warnings = re.findall(r"fasttrain: warning: process \d+ had finished its command with exit status (\d), "
                              r"then its exit ended it by signal SIGKILL", proc.stderr)
        assert warnings == ([] if not how else ["0", "2"]), proc.stderr


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def test_the_server_takes_the_commands_signals_and_leaves_its_socket_behind_it(tmp_path):
    """SIGTERM to `fasttrain serve` goes to its command, and the server exits with it; its socket's
    folder goes too."""
    serve = subprocess.Popen([BIN / "fasttrain", "serve", "--", sys.executable, "-c",
                              "import os, time; print(os.environ['FASTTRAIN_SERVER'], flush=True); time.sleep(60)"],
                             cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    socket_path = Path(serve.stdout.readline().strip())
    deadline = time.monotonic() + 60
    while not socket_path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert socket_path.exists()
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=60) == 128 + signal.SIGTERM
    assert not socket_path.parent.exists()
