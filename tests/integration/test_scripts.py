"""The GPU harness (scripts/gpu/): its scripts run where no test can watch them, so their contract
is checked here on the CPU. Deselected by `make test`; `make test-harness` runs them."""

import datetime
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest
from scratch import REPO, TINY, copy_repo, run

pytestmark = pytest.mark.harness
GPU = REPO / "scripts" / "gpu"
DETACHED = str(GPU / "detached.sh")


def detached(*args, out=None, timeout=60):
    env = {**os.environ, **({"OUT": str(out)} if out else {})}
    return subprocess.run(["bash", DETACHED, *map(str, args)], capture_output=True, text=True, env=env, check=False,
                          timeout=timeout)


def test_detached_run_outlives_its_call_and_a_later_call_collects_it(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    flag = tmp_path / "go"
    # What the command prints is not in its own text, which the starting call echoes.
    script = (f"echo the command says $((6 * 7)); while [ ! -e {flag} ]; do sleep 0.1; done; "
              f"echo result > {run_dir}/out/r.txt; exit 3")

    first = detached(run_dir, 1, "--", "bash", "-c", script, out=out)
    assert first.returncode == 75, first.stdout + first.stderr  # still running when the call ends
    assert "the command says 42" in first.stdout and "still running" in first.stdout  # the log's tail
    assert not (run_dir / "rc").exists() and list(out.iterdir()) == []

    again = detached(run_dir, 1, "--", "echo", "a second command", out=out)  # never starts another
    assert again.returncode == 75 and "already holds a run" in again.stdout

    flag.touch()
    done = detached(run_dir, 30, out=out)
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own exit status
    assert "ended with exit status 3" in done.stdout and "the command says 42" in done.stdout
    assert (out / "r.txt").read_text() == "result\n"
    assert "a second command" not in (run_dir / "log").read_text()


def test_detached_says_when_its_run_is_gone_or_was_never_started(tmp_path):
    never = detached(tmp_path / "none", 1)
    assert never.returncode == 2 and "no run in" in never.stderr

    run_dir = tmp_path / "run"
    started = detached(run_dir, 0, "--", "sleep", "60")
    assert started.returncode == 75
    pid = int((run_dir / "pid").read_text())
    os.killpg(os.getpgid(pid), 9)  # the host ended it, say: the run and its process group die
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["kill", "-0", str(pid)], check=False).returncode == 0:
        time.sleep(0.1)
    gone = detached(run_dir, 1)
    assert gone.returncode == 1 and "gone without an exit status" in gone.stderr


@pytest.mark.slow
def test_kernel_sass_counts_the_loader_kernel_for_hopper():
    """Triton's compiler and ptxas, from the torch wheel's triton: no GPU needed."""
    proc = subprocess.run([sys.executable, str(GPU / "kernel_sass.py")], capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"(\d+) instructions per thread, 768 output values per program of 128 threads: "
                      r"([\d.]+) thread-instructions per output value \(sm_90\)", proc.stdout)
    assert found, proc.stdout
    # The figures docs/loader-kernel.md cites (torch 2.14.1's Triton): 356 x 128 / 768 = 59.33.
    assert (int(found[1]), float(found[2])) == (356, 59.3)


def test_pool_sass_tells_which_cases_a_kernel_change_moves(tmp_path):
    """Three versions of the pool kernels compiled for sm_90 (no GPU): the repository's, a copy, and
    one that takes the last maximum of a window (a forward change only)."""
    source = (REPO / "src/fasttrain/pool_triton.py").read_text()
    assert source.count("(v > best)") == 1
    same, ties_last = tmp_path / "same.py", tmp_path / "ties_last.py"
    same.write_text(source)
    ties_last.write_text(source.replace("(v > best)", "(v >= best)"))
    files = [REPO / "src/fasttrain/pool_triton.py", same, ties_last]
    proc = subprocess.run([sys.executable, str(GPU / "pool_sass.py"), "--dtype", "bf16", *map(str, files)],
                          capture_output=True, check=False, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    rows = [re.fullmatch(r"(forward|backward) bf16 (\d/\d/\d) c(64|16): (.*)", line) for line in lines[:-1]]
    assert len(rows) == 12 and all(rows), proc.stdout
    for row in rows:
        (n0, d0), (n1, d1), (n2, d2) = re.findall(r"(\d+) instructions, sass ([0-9a-f]{12})", row[4])
        assert int(n0) > 100 and (n0, d0) == (n1, d1), row[0]  # the same source, the same machine code
        assert (d2 != d0) == (row[1] == "forward"), row[0]  # the change moves the forward only
    assert lines[-1].startswith("6 of 12 cases differ from ") and "(sm_90, Triton " in lines[-1], lines[-1]


def fast_summary(*args):
    return subprocess.run([sys.executable, str(GPU / "fast_summary.py"), *map(str, args)],
                          capture_output=True, text=True, check=False, timeout=60)


def _curve(path, rows):
    lines = ["epoch,elapsed_seconds,epoch_seconds,train_loss,test_accuracy,lr,images_per_second,img_size"]
    lines += [f"{i + 1},{i + 1},1,{loss},{acc},0.001,1000,{size}" for i, (loss, acc, size) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_fast_summary_tables_accuracy_the_switch_and_collapses(tmp_path):
    rows = [  # config 2's rows predate the "config" field: --configs numbers them
        {"overrides": "a=1", "config": 1, "seed": 0, "test_accuracy": 0.85},
        {"overrides": "a=1", "config": 1, "seed": 1, "test_accuracy": 0.83},
        {"overrides": "a=1", "config": 1, "seed": 2, "test_accuracy": 0.86},
        {"overrides": "b=2", "seed": 0, "test_accuracy": 0.70},
    ]
    for r in rows:
        r.update(train_seconds=17.0, compile_seconds=None, images_per_second=53000.0, jobs=4)
    (tmp_path / "fast.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _curve(tmp_path / "epochs-1-0.csv", [(2.0, 0.3, 160), (1.0, 0.5, 160), (1.2, 0.6, 227)])  # x1.20
    _curve(tmp_path / "epochs-1-1.csv", [(2.0, 0.3, 160), (1.0, 0.5, 160), (0.9, 0.1, 227)])  # x0.90, collapse
    _curve(tmp_path / "epochs-1-2.csv", [(2.0, 0.1, 160), (1.0, 0.5, 160), (1.5, 0.6, 227)])  # below 0.2 first: no collapse
    _curve(tmp_path / "epochs-2-0.csv", [(2.0, 0.45, 227), (1.8, 0.15, 227)])  # no switch; a collapse

    table = fast_summary(tmp_path, "--configs", "a=1 b=2")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[2:] == [
        "| `a=1` | 3 | 1 | 0.8300 / 0.8500 / 0.8600 | ×0.90 to ×1.50 | 1: epoch 3 | 1: epoch 3, -0.40 |",
        "| `b=2` | 1 | 1 | 0.7000 / 0.7000 / 0.7000 | (no switch) | 0: epoch 2 | 0: epoch 2, -0.30 |",
    ]
    assert "set back by > 0.35" in fast_summary(tmp_path, "--configs", "a=1 b=2", "--setback", "0.35").stdout
    assert fast_summary(tmp_path, "--configs", "a=1 b=2", "--setback", "0.35").stdout.splitlines()[3].endswith(
        "| 0: epoch 2 | none |")  # a fall of 0.30 is not one of more than 0.35
    (tmp_path / "epochs-1-2.csv").unlink()  # a run without its curve: counted for accuracy, named
    assert fast_summary(tmp_path, "--configs", "a=1 b=2").stdout.splitlines()[2].endswith(
        "| 1: epoch 3, -0.40 (no curve for seed 2) |")
    assert "| 0 | `b=2` | 4 | 17.00 |  | 53,000 | 0.7000 |" in fast_summary(tmp_path, "--configs", "a=1 b=2", "--runs").stdout
    assert "below 0.86" in fast_summary(tmp_path, "--configs", "a=1 b=2", "--mark", "0.86").stdout

    unnumbered = fast_summary(tmp_path)
    assert unnumbered.returncode != 0 and "'b=2' records no config number" in unnumbered.stderr

    wall = fast_summary(tmp_path, "--configs", "a=1 b=2", "--wall").stdout.splitlines()
    assert wall[-1] == "4 run(s) recorded no seconds by phase (fast.jsonl rows from before fast.sh kept them)"
    timed = dict(rows[0], train_wall_seconds=50.0, evaluate_wall_seconds=10.0, checkpoints_written=1,
                 compile_cache={"aot_autograd": {"hit": 1, "miss": 1, "bypass": 0},
                                "inductor": {"hit": 2, "miss": 2, "bypass": 0}},
                 train_process_seconds={"start_up": 9.0, "runtime": 2.5, "prepare": 1.0, "warm_up": 12.0,
                                        "train": 13.0, "eval": 3.0, "checkpoints": 1.5, "final_model": 0.5,
                                        "other": 0.5, "total": 43.0},
                 evaluate_process_seconds={"start_up": 6.0, "runtime": 2.0, "prepare": 0.5, "eval": 0.75,
                                           "other": 0.25, "total": 9.5})
    (tmp_path / "fast.jsonl").write_text(json.dumps(timed) + "\n")
    wall = fast_summary(tmp_path, "--wall").stdout.splitlines()
    assert wall[0].startswith("| seed | train wall | train: start_up |") and len(wall) == 3
    # 50 - 43 = 7.00 after the train metrics, 10 - 9.5 = 0.50 after the evaluation's
    assert wall[2] == ("| 0 | 50.00 | 9.00 | 2.50 | 1.00 | 12.00 | 13.00 | 3.00 | 1.50 | 0.50 | 0.50 | 7.00 | 1 "
                       "| 1/2 | 10.00 | 6.00 | 2.00 | 0.50 | 0.75 | 0.25 | 0.50 |")


@pytest.mark.slow
def test_fast_sh_sweeps_configurations_two_runs_at_a_time(tmp_path):
    """fast.sh on the CPU (a small model, no compile): JOBS=2 runs share the device, seed by seed;
    every run leaves its row and curve, and fast_summary reads them without --configs."""
    from PIL import Image

    archive = tmp_path / "mini.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for split, n in (("train", 8), ("test", 2)):
            for c in range(10):
                for i in range(n):
                    png = io.BytesIO()
                    Image.new("RGB", (32, 32), (25 * c, 3 * i, 255 - 25 * c)).save(png, "PNG")
                    info = tarfile.TarInfo(f"mini/{split}/c{c}/{i}.png")
                    info.size = png.tell()
                    tar.addfile(info, io.BytesIO(png.getvalue()))
    small = ("model.name=squeezenet1_1,train.device=cpu,train.compile=false,train.img_size=32,"
             "train.batch_size=16,evaluate.batch_size=20,train.epochs=2")
    configs = f"{small},train.progressive_epochs=1,train.progressive_size=24 {small},train.progressive_epochs=0"
    proc = run(["bash", str(GPU / "fast.sh"), str(archive), str(tmp_path / "work"), str(tmp_path / "out"), "0 1",
                configs, "skip-bench"], tmp_path, timeout=600, check=False, env={"JOBS": "2", "NO_TESTS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "fast.jsonl").read_text().splitlines()]
    assert sorted((r["config"], r["seed"]) for r in rows) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {r["jobs"] for r in rows} == {2} and {r["epochs"] for r in rows} == {2}
    assert all((tmp_path / "out" / f"epochs-{r['config']}-{r['seed']}.csv").exists() for r in rows)
    for r in rows:  # each command's seconds by phase, within the wall time fast.sh measured around it
        assert r["train_process_seconds"]["total"] <= r["train_wall_seconds"] + 0.01
        assert r["evaluate_process_seconds"]["total"] <= r["evaluate_wall_seconds"] + 0.01
        assert r["checkpoints_written"] == 0  # the recipe's checkpoint_every 100 over 2 epochs; none after the last
        assert abs(datetime.datetime.fromisoformat(r["started_at"]).timestamp() - time.time()) < 600  # this test's run

    table = fast_summary(tmp_path / "out")
    assert table.returncode == 0, table.stderr
    body = table.stdout.splitlines()[2:]
    assert len(body) == 2 and "train.progressive_size=24` | 2 |" in body[0] and "(no switch)" in body[1]


@pytest.mark.parametrize("grad_clip", [None, 1.0])
def test_sweep_profiles_the_training_step_on_the_cpu(grad_clip, monkeypatch):
    """sweep.py's profiled step is the training loop's step; on the CPU it has no CUDA kernels."""
    monkeypatch.syspath_prepend(str(GPU))
    import sweep

    from fasttrain import config, parallel
    from fasttrain.precision import PRECISIONS

    params = config.from_dict({"model": {"name": "squeezenet1_1"},
                               "train": {"img_size": 32, "device": "cpu", "grad_clip": grad_clip}})
    result = sweep.kernel_ms_per_step(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), 10, 8, steps=3)
    assert result["wall_ms_per_step_profiled"] > 0 and result["kernel_ms_per_step"] == 0 and result["top"] == []


def test_pools_times_every_way_of_alexnets_pools_and_each_is_the_same_function(tmp_path, monkeypatch):
    """pools.py on the CPU, small, the fused way's Triton kernels under Triton's interpreter: every pool
    of AlexNet in every way, each way's output and input gradient those of torch's pool (ties
    included: the inputs sit on a coarse grid)."""
    pytest.importorskip("triton")
    out = tmp_path / "pools.json"
    run([sys.executable, str(GPU / "pools.py"), "--batch", "2", "--size", "63", "--iters", "2", "--dtype", "fp32",
         "--out", str(out)], REPO, env={"TRITON_INTERPRET": "1"})
    monkeypatch.syspath_prepend(str(GPU))
    import pools

    rows = json.loads(out.read_text())
    assert [r["way"] for r in rows] == list(pools.WAYS) * 3
    assert [r["layer"].split()[0] for r in rows[::len(pools.WAYS)]] == ["pool1", "pool2", "pool3"]
    assert rows[0]["layer"] == "pool1 [2, 64, 15, 15]"  # AlexNet's first pool at 63 px
    assert all(r["ms"] > 0 and r["gb_per_s"] > 0 for r in rows)
    assert [r["triton"] for r in rows] == [r["way"] == "fused" for r in rows]  # the kernels ran, interpreted
    # the same function: the separable ways may add one pixel's gradients from two windows in another order
    assert all(r["max_abs_diff"] <= 1e-6 for r in rows), [(r["layer"], r["way"], r["max_abs_diff"]) for r in rows]
    assert all(r["max_abs_diff"] == 0 for r in rows if not r["way"].endswith("separable"))


def repro_sh(repo, out, seconds, *args, variants, work, timeout=900):
    """scripts/gpu/repro.sh from a scratch copy of the repo, on the CPU with TINY's params, queueing
    only `variants` (FT_VARIANTS) and making only their evaluate stages (FT_TARGETS)."""
    overrides = [f"{section}.{key}={value}" for section, values in TINY.items() for key, value in values.items()
                 if key != "source"]
    small = "-S train.epochs=1 -S train.progressive_epochs=0 -S train.batch_size=32 -S train.compile=false"
    env = {"FT_VARIANTS": " ".join(variants), "FT_FAST_EXTRA": small,
           "FT_TARGETS": " ".join(f"evaluate@{v}-0" for v in variants)}
    return run(["bash", str(repo / "scripts" / "gpu" / "repro.sh"), "synthetic", str(work), str(out), str(seconds),
                *args, *overrides],
               repo, timeout=timeout, check=False, env=env)


@pytest.mark.slow
def test_repro_queue_trains_each_variant_once_and_dvc_repro_restores_them(tmp_path):
    """The README's several-GPU recipe as repro.sh --queue runs it: the queued experiments train,
    and the dvc repro after restores every stage from the run-cache instead of training again."""
    repo = copy_repo(tmp_path / "repo")
    variants = ["single-fp32", "ddp-bf16"]
    proc = repro_sh(repo, tmp_path / "out", 600, "--queue", "2", variants=variants, work=tmp_path / "work")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "out" / "repro.log").read_text()
    assert log.count("Success") == 2, log
    for v in variants:
        for stage in ("train", "evaluate"):
            assert f"Stage '{stage}@{v}-0' is cached - skipping run" in log, log
    assert "Running stage" not in log, log  # nothing trained twice
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"metrics/eval/seed0/{v}.json" for v in variants} <= names


@pytest.mark.slow
def test_repro_queue_out_of_time_exits_75_and_the_same_call_again_finishes(tmp_path):
    """A queue stopped at its time limit: the call says so and exits 75 without a dvc repro of its own;
    the same call again does not queue anything twice, its dvc repro makes the stages, and --fast's
    experiment runs after."""
    repo, work, out = copy_repo(tmp_path / "repo"), tmp_path / "work", tmp_path / "out"
    variants = ["single-fp32", "dp-amp"]
    first = repro_sh(repo, out, 1, "--queue", "2", "--fast", "0", variants=variants, work=work)
    assert first.returncode == 75, first.stdout[-3000:] + first.stderr[-3000:]
    assert "the queue ran out of time" in first.stdout and "call again with the same arguments" in first.stdout
    assert "Queued experiment 'dp-amp'" in (out / "queue.log").read_text()
    assert not (out / "results.tar.gz").exists()

    out = tmp_path / "again"
    again = repro_sh(repo, out, 600, "--queue", "2", "--fast", "0", variants=variants, work=work)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert not (out / "queue.log").exists()  # nothing queued again
    log = (out / "repro.log").read_text()
    assert "dvc repro exit status 0" in again.stdout
    assert all(f"stage 'evaluate@{v}-0'" in log.lower() for v in variants), log
    assert "Ran experiment(s)" in (out / "fast.log").read_text()
    with tarfile.open(out / "results.tar.gz") as tar:
        evals = {n for n in tar.getnames() if n.startswith("metrics/eval/")}
    assert {f"metrics/eval/seed0/{v}.json" for v in variants} <= evals
