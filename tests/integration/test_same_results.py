"""A change that only reorganises the code trains the same models: single, dp and ddp runs on the
CPU of this tree and of REFERENCE, the newest commit whose results this tree must keep, are bit for
bit the same (weights, per-epoch curves, headline metrics).

A commit that changes what training computes on purpose moves REFERENCE to itself and says why in
its message; every other commit keeps it. The reference tree comes from this repository's own
history (`git archive`), so a clone without it (shallow) fails here and says so."""

import csv
import json
import os
import subprocess
import tarfile

import pytest
import torch
import yaml
from scratch import REPO, TINY, run

REFERENCE = "6ee52da0ac8ea293ba35b32804c765f49ffa9c3f"  # config: one lookup (_retired) for a moved or removed key

# augmentation, dropout, a schedule and gradient clipping: every random draw and every step's state
PARAMS = {**TINY, "data": {**TINY["data"], "augment": True},
          "train": {**TINY["train"], "epochs": 2, "scheduler": "onecycle", "grad_clip": 1.0,
                    "device": "cpu", "nproc": 2}}
VARIANTS = ("single-fp32", "dp-fp32", "ddp-fp32", "single-bf16")
HEADLINE = ("epochs", "train_loss", "test_accuracy")


def _reference_tree(dest):
    archive = subprocess.run(["git", "archive", "--format=tar", REFERENCE, "src"], cwd=REPO,
                             capture_output=True)
    if archive.returncode:
        pytest.fail(f"commit {REFERENCE[:12]} is not in this repository ({archive.stderr.decode().strip()}): "
                    f"clone its full history (git fetch --unshallow)")
    dest.mkdir()
    archive_path = dest / "src.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def _written(folder, *parts):
    """An output as this tree lays it out (seed 0's runs under seed0/) or as the reference did (no seed folder)."""
    seeded = folder.joinpath(*parts[:-1], "seed0", parts[-1])
    return seeded if seeded.exists() else folder.joinpath(*parts)


def _train(folder, src) -> dict:
    """Each variant's weights, curve and headline metrics, trained by the fasttrain in `src`."""
    folder.mkdir()
    (folder / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    env = {"PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    python = ["python", "-m", "fasttrain"]
    run([*python, "download"], folder, env=env)
    out = {}
    for variant in VARIANTS:
        parallel, precision = variant.split("-")
        run([*python, "train", "--parallel", parallel, "--precision", precision], folder, env=env, timeout=600)
        with open(_written(folder, "plots", "train", f"{variant}.csv")) as f:
            curve = [(r["train_loss"], r["test_accuracy"], r["lr"], r["max_grad_norm"]) for r in csv.DictReader(f)]
        metrics = json.loads(_written(folder, "metrics", "train", f"{variant}.json").read_text())
        out[variant] = (torch.load(_written(folder, "models", f"{variant}.pt"), weights_only=True)["model"],
                        curve, {k: metrics[k] for k in HEADLINE})
    return out


def test_this_tree_trains_what_the_reference_commit_trains(tmp_path):
    now = _train(tmp_path / "now", REPO / "src")
    before = _train(tmp_path / "before", _reference_tree(tmp_path / "reference"))

    for variant in VARIANTS:
        (weights, curve, metrics), (weights_then, curve_then, metrics_then) = now[variant], before[variant]
        assert curve == curve_then, variant
        assert metrics == metrics_then, variant
        assert weights.keys() == weights_then.keys(), variant
        for name, tensor in weights_then.items():
            assert torch.equal(weights[name], tensor), f"{variant}: {name} differs from {REFERENCE[:12]}'s"
