"""The product end to end: the real `dvc repro` of all 12 variants in a scratch copy of the repo."""

import json

import pytest
import yaml

from scratch import run, set_params
from test_plots_browser import assert_draws_offline

from fasttrain.layout import VARIANTS

pytestmark = pytest.mark.slow


def stages_run(output: str) -> list[str]:
    return sorted(line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage"))


def test_dvc_repro_trains_evaluates_and_compares_all_variants(tiny_repo, tmp_path):
    first = run(["dvc", "repro"], tiny_repo, timeout=1800)
    assert len(stages_run(first.stdout)) == 1 + 12 + 12 + 1

    for variant in VARIANTS:
        train = json.loads((tiny_repo / "metrics" / "train" / f"{variant}.json").read_text())
        assert train["variant"] == variant and train["epochs"] == 1
        assert train["images_per_second"] > 0 and train["peak_memory_mb"] > 0
        assert train["torch_version"] and train["device"] == "CPU"
        assert train["world_size"] == (2 if variant.startswith("ddp") else 1)
        if variant.startswith("dp-"):
            assert any("DataParallel" in w for w in train["warnings"])
        ev = json.loads((tiny_repo / "metrics" / "eval" / f"{variant}.json").read_text())
        assert ev["test_images"] == 50 and 0 <= ev["test_accuracy"] <= 1
        assert sum(map(sum, ev["confusion_matrix"])) == 50
        confusion_rows = (tiny_repo / "plots" / "confusion" / f"{variant}.csv").read_text().splitlines()
        assert len(confusion_rows) == 1 + 50
        assert (tiny_repo / "models" / f"{variant}.pt").is_file()
        assert list((tiny_repo / "tensorboard" / variant).glob("events.out.tfevents.*"))

    table = json.loads((tiny_repo / "metrics" / "compare.json").read_text())
    assert [r["variant"] for r in table["rows"]] == list(VARIANTS)
    base = next(r for r in table["rows"] if r["variant"] == "single-fp32")
    assert base["speedup"] == 1.0 and base["accuracy_change"] == 0.0
    markdown = (tiny_repo / "metrics" / "compare.md").read_text()
    assert all(f"| {v} |" in markdown for v in VARIANTS)
    assert "speed-up" in markdown

    # The plots page of this run, in a real browser with the network unplugged (docs/img/plots-offline.png)
    run(["dvc", "plots", "show", "-o", str(tmp_path / "show")], tiny_repo)
    assert_draws_offline(tmp_path / "show" / "index.html", tmp_path, 4 + 2 + 2 * len(VARIANTS))

    second = run(["dvc", "repro"], tiny_repo)
    assert stages_run(second.stdout) == [], second.stdout

    # Changing train.lr re-runs train, evaluate and compare, never download.
    run(["git", "add", "-A"], tiny_repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first run"], tiny_repo)
    set_params(tiny_repo, {"train": {"lr": 5e-3}})
    third = run(["dvc", "repro"], tiny_repo, timeout=1800)
    ran = stages_run(third.stdout)
    assert "download" not in ran
    assert len([s for s in ran if s.startswith("train@")]) == 12
    assert len([s for s in ran if s.startswith("evaluate@")]) == 12
    assert "compare" in ran

    diff = json.loads(run(["dvc", "metrics", "diff", "--json"], tiny_repo).stdout)
    changed = diff["metrics/train/single-fp32.json"]
    assert changed["final_train_loss"]["diff"] != 0
    assert yaml.safe_load((tiny_repo / "params.yaml").read_text())["train"]["lr"] == 5e-3
