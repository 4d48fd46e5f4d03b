"""`dvc plots show` and `dvc plots diff` build one page with every variant in every chart.

Training all 12 variants takes minutes, so the per-variant files are fabricated here, written by the
very functions `train` and `evaluate` write them with; `fasttrain compare` then runs for real.
"""

import json
import random
import re

import pytest
import torch

from scratch import run

from fasttrain import atomic
from fasttrain.evaluate import _confusion_csv
from fasttrain.layout import VARIANTS, Layout
from fasttrain.report import history_csv
from fasttrain.saved import EpochRecord

pytestmark = pytest.mark.slow

CURVES = {"train_loss_by_epoch": ("epoch", "train_loss"), "test_accuracy_by_epoch": ("epoch", "test_accuracy"),
          "train_loss_by_seconds": ("elapsed_seconds", "train_loss"),
          "test_accuracy_by_seconds": ("elapsed_seconds", "test_accuracy")}
BARS = {"images_per_second", "peak_memory_mb", "speedup", "accuracy_change"}
INTERVAL_BARS = {"images_per_second", "speedup", "accuracy_change"}  # .dvc/plots/bars_interval.json: error bars
CLASSES = [f"class{i}" for i in range(10)]


def fabricate_run(repo, seed: int) -> None:
    """What `dvc repro` of every train and evaluate stage leaves behind, with plausible numbers."""
    layout = Layout(repo)
    for k, variant in enumerate(VARIANTS):
        rnd = random.Random(f"{seed}-{variant}")
        speed = 500 * (1 + k) * rnd.uniform(0.9, 1.1)  # images/s
        history = [EpochRecord(e, 1000 / speed, 2.3 / e, 0.1 + 0.1 * e, 1e-3, 1000) for e in (1, 2, 3)]
        confusion = torch.randint(0, 3, (10, 10), generator=torch.Generator().manual_seed(seed + k))
        confusion += torch.diag(torch.full((10,), 10))
        atomic.atomic_write_text(layout.train_plot(variant), history_csv(history))
        atomic.atomic_write_text(layout.confusion_plot(variant), _confusion_csv(confusion, CLASSES))
        atomic.atomic_write_json(layout.train_metrics(variant), {
            "epoch_seconds": 1000 / speed, "images_per_second": round(speed, 1),
            "peak_memory_mb": round(300 + 50 * k * rnd.random(), 1)})
        atomic.atomic_write_json(layout.train_diagnostics(variant), {
            "variant": variant, "first_epoch_seconds": 2000 / speed,
            "world_size": 2 if variant.startswith("ddp") else 1, "device_count": 1, "warnings": [],
            "device": "CPU", "torch_version": torch.__version__,
            "speed_samples": {"kind": "windows", "images_per_second": [speed * rnd.uniform(0.95, 1.05) for _ in range(7)]}})
        accuracy = float(confusion.diag().sum() / confusion.sum())
        atomic.atomic_write_json(layout.eval_metrics(variant), {
            "variant": variant, "test_accuracy": accuracy, "test_images": 1000})
        right = round(1000 * accuracy)  # every variant saw the same 1,000 test images
        atomic.atomic_write_json(layout.eval_diagnostics(variant), {"correct": "1" * right + "0" * (1000 - right)})
    run(["fasttrain", "compare"], repo)


def specs_in_page(html: str) -> dict:
    """The vega-lite spec of every chart on the page, by its div id (the plot id of dvc.yaml)."""
    found = re.findall(r'<div id = "([^"]+)">\s*<script type = "text/javascript">\s*var spec = (\{.*?\});\s*vegaEmbed',
                       html, re.S)
    return {div: json.loads(spec) for div, spec in found}


def variants_in(spec: dict, key: str) -> set[str]:
    return {row[key].removesuffix(".csv") for row in spec["data"]["values"]}


def test_plots_page_shows_every_variant_in_every_chart(tiny_repo, tmp_path):
    fabricate_run(tiny_repo, seed=0)
    assert (tiny_repo / "plots" / "compare.csv").read_text().splitlines()[0].startswith(
        "variant,images_per_second,images_per_second_low,images_per_second_high,peak_memory_mb")
    run(["dvc", "plots", "show", "-o", str(tmp_path / "show")], tiny_repo)
    page = (tmp_path / "show" / "index.html").read_text()
    specs = specs_in_page(page)
    assert len(specs) == len(CURVES) + len(BARS) + 2 * len(VARIANTS), sorted(specs)

    for plot_id, (x, y) in CURVES.items():
        spec = specs[plot_id]
        assert (spec["encoding"]["x"]["field"], spec["encoding"]["y"]["field"]) == (x, y)
        assert variants_in(spec, "filename") == set(VARIANTS), plot_id
    for plot_id in BARS:
        spec = specs[plot_id]
        bar, *error = spec["layer"] if "layer" in spec else [spec]
        assert bar["encoding"]["x"]["field"] == plot_id
        assert variants_in(spec, "variant") == set(VARIANTS), plot_id
        if plot_id in INTERVAL_BARS:  # an error bar from the interval's two ends, which hold the figure
            (rule,) = error
            assert (rule["encoding"]["x"]["field"], rule["encoding"]["x2"]["field"]) == (f"{plot_id}_low",
                                                                                       f"{plot_id}_high")
            for row in spec["data"]["values"]:
                if row["variant"] != "single-fp32" or plot_id == "images_per_second":
                    low, x, high = (float(row[k]) for k in (f"{plot_id}_low", plot_id, f"{plot_id}_high"))
                    assert low < x < high, (plot_id, row)
    for variant in VARIANTS:
        spec = specs[f"plots_train_seed0_{variant}_csv"]
        assert spec["title"]["text"] == f"Images/s by epoch, {variant}, seed 0"
        assert [row["epoch"] for row in spec["data"]["values"]] == ["1", "2", "3"]
        spec = specs[f"plots_confusion_seed0_{variant}_csv"]
        assert spec["title"]["text"] == f"Confusion matrix, {variant}, seed 0 (test set)"
        rows = (tiny_repo / "plots" / "confusion" / "seed0" / f"{variant}.csv").read_text().splitlines()[1:]
        assert len(spec["data"]["values"]) == len(rows)  # one row per test image


def test_plots_diff_against_an_earlier_revision(tiny_repo, tmp_path):
    fabricate_run(tiny_repo, seed=0)
    run(["git", "add", "-A"], tiny_repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first run"], tiny_repo)
    fabricate_run(tiny_repo, seed=1)

    out = run(["dvc", "plots", "diff", "HEAD", "--json", "-o", str(tmp_path / "diff")], tiny_repo).stdout
    data = json.loads(out)["data"]
    for plot_id in [*CURVES, *BARS]:
        (plot,) = data[plot_id]
        values = plot["content"]["data"]["values"]
        assert {row["rev"] for row in values} == {"HEAD", "workspace"}, plot_id
    head = {r["variant"]: r["images_per_second"] for r in data["images_per_second"][0]["content"]["data"]["values"]
            if r["rev"] == "HEAD"}
    now = {r["variant"]: r["images_per_second"] for r in data["images_per_second"][0]["content"]["data"]["values"]
           if r["rev"] == "workspace"}
    assert set(head) == set(now) == set(VARIANTS) and head != now
