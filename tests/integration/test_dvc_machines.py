"""Variants spread over machines the DVC way: two clones each train a variant as a DVC
experiment and push it to a shared git remote (a bare repository) and a shared DVC remote (a local
folder); a third clone pulls both and gets the compare table without training anything.

The other 10 variants' results are in the remote's commit already, as if trained elsewhere before:
written by the test (their figures do not matter here) and recorded with `dvc commit`, so the test
trains two tiny variants, not twelve.
"""

import json
import subprocess
from pathlib import Path

import pytest
from scratch import TINY, copy_repo, run, set_params

from fasttrain.layout import VARIANTS, Layout

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
TRAINED = {"a": "single-fp32", "b": "ddp-fp32"}  # clone -> the variant it trains


def sh(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run(cmd, cwd, env=GIT_ENV)


def scaffold(repo: Path, variant: str) -> None:
    """A variant's outputs as its train and evaluate stages would leave them."""
    layout = Layout(repo)
    for path in (layout.model(variant), layout.train_metrics(variant), layout.eval_metrics(variant),
                 layout.train_diagnostics(variant), layout.eval_diagnostics(variant),
                 layout.train_plot(variant), layout.confusion_plot(variant)):
        path.parent.mkdir(parents=True, exist_ok=True)
    layout.model(variant).write_bytes(variant.encode())
    layout.train_metrics(variant).write_text(json.dumps({
        "epoch_seconds": 1.0, "images_per_second": 100.0, "peak_memory_mb": 10.0}))
    layout.train_diagnostics(variant).write_text(json.dumps({
        "first_epoch_seconds": 2.0, "world_size": 1, "device_count": 1, "warnings": [], "device": "CPU",
        "torch_version": "x"}))
    layout.eval_metrics(variant).write_text(json.dumps({"test_accuracy": 0.1}))
    layout.eval_diagnostics(variant).write_text(json.dumps({"device": "CPU"}))
    layout.train_plot(variant).write_text("epoch,train_loss,test_accuracy\n1,2.3,0.1\n")
    layout.confusion_plot(variant).write_text("actual,predicted\n")
    layout.tensorboard(variant).mkdir(parents=True, exist_ok=True)
    (layout.tensorboard(variant) / "events.out.tfevents.0.scaffold").write_bytes(b"")


# train's and evaluate's metrics and plots are in DVC's cache (dvc.yaml): `dvc push --run-cache` sends
# a run entry's cached outputs only, so with `cache: false` on them the third machine trains again.
@pytest.mark.slow
def test_two_machines_push_experiments_and_a_third_pulls_them_and_compares(tmp_path):
    git_remote, dvc_remote = tmp_path / "origin.git", tmp_path / "dvc-store"
    sh(["git", "init", "-q", "--bare", str(git_remote)], tmp_path)

    # The shared starting point: the data set and 10 variants' results, pushed to both remotes.
    first = copy_repo(tmp_path / "first")
    set_params(first, TINY)
    set_params(first, {"train": {"device": "cpu"}})  # ddp: 2 gloo processes
    sh(["dvc", "remote", "add", "-d", "shared", str(dvc_remote)], first)
    sh(["dvc", "repro", "download"], first)
    others = [v for v in VARIANTS if v not in TRAINED.values()]
    for v in others:
        scaffold(first, v)
    sh(["dvc", "commit", "-f", *(f"{stage}@{v}-0" for v in others for stage in ("train", "evaluate"))], first)
    sh(["git", "add", "-A"], first)
    sh(["git", "commit", "-qm", "10 variants"], first)
    sh(["git", "remote", "add", "origin", str(git_remote)], first)
    sh(["git", "push", "-q", "origin", "HEAD:main"], first)
    sh(["dvc", "push"], first)

    # Two machines, one variant each, as experiments.
    for name, variant in TRAINED.items():
        clone = tmp_path / name
        sh(["git", "clone", "-q", "-b", "main", str(git_remote), str(clone)], tmp_path)
        sh(["dvc", "pull", "--allow-missing"], clone)  # not yet trained: nothing to pull
        sh(["dvc", "exp", "run", "-n", f"{name}-{variant}", f"train@{variant}-0", f"evaluate@{variant}-0"], clone)
        sh(["dvc", "exp", "push", "--run-cache", "origin", f"{name}-{variant}"], clone)

    # The third machine: pull both, then the whole pipeline, restored rather than run.
    third = tmp_path / "third"
    sh(["git", "clone", "-q", "-b", "main", str(git_remote), str(third)], tmp_path)
    listed = sh(["dvc", "exp", "list", "origin"], third).stdout
    assert all(f"{n}-{v}" in listed for n, v in TRAINED.items()), listed
    sh(["dvc", "exp", "pull", "--run-cache", "origin", *(f"{n}-{v}" for n, v in TRAINED.items())], third)
    sh(["dvc", "pull", "--allow-missing"], third)
    repro = sh(["dvc", "repro"], third)
    out = repro.stdout + repro.stderr
    print(out)
    for v in TRAINED.values():
        assert f"Stage 'train@{v}-0' is cached - skipping run, checking out outputs" in out, out
        assert f"Stage 'evaluate@{v}-0' is cached - skipping run, checking out outputs" in out, out
    assert "Running stage 'train@" not in out and "Running stage 'evaluate@" not in out, out
    assert "Running stage 'compare'" in out
    table = json.loads((third / "metrics" / "compare.json").read_text())
    rows = table["variants"]
    assert list(rows) == list(VARIANTS)
    for name, v in TRAINED.items():  # the two trained results, as their machines measured them
        measured = json.loads((tmp_path / name / "metrics" / "train" / "seed0" / f"{v}.json").read_text())
        assert rows[v]["images_per_second"] == measured["images_per_second"]
    assert rows["ddp-fp32"]["world_size"] == 2
