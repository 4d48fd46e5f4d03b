"""The comparison table against a hand-made case whose answers are worked out below, not computed."""

import json
import math

import pytest

from fasttrain.compare import compare, to_markdown
from fasttrain.errors import FasttrainError
from fasttrain.layout import VARIANTS, Layout

# variant: (images/s, test accuracy) as its train and eval metrics files say; every row differs, so
# a row that read another variant's files would show.
MEASURED = {
    "single-fp32": (1000.0, 0.50), "single-autocast": (1250.0, 0.51), "single-amp": (1500.0, 0.4875),
    "single-bf16": (1010.0, 0.50), "dp-fp32": (800.0, 0.52), "dp-autocast": (900.0, 0.45),
    "dp-amp": (2500.0, 0.4975), "dp-bf16": (3000.0, 0.5525), "ddp-fp32": (1750.0, 0.49),
    "ddp-autocast": (400.0, 0.10), "ddp-amp": (3500.0, 0.5), "ddp-bf16": (4125.0, 0.505),
}
# variant: (speed-up over single-fp32, accuracy change in percentage points), by hand
EXPECTED = {
    "single-fp32": (1.0, 0.0), "single-autocast": (1.25, 1.0), "single-amp": (1.5, -1.25),
    "single-bf16": (1.01, 0.0), "dp-fp32": (0.8, 2.0), "dp-autocast": (0.9, -5.0),
    "dp-amp": (2.5, -0.25), "dp-bf16": (3.0, 5.25), "ddp-fp32": (1.75, -1.0),
    "ddp-autocast": (0.4, -40.0), "ddp-amp": (3.5, 0.0), "ddp-bf16": (4.125, 0.5),
}


IMAGES = 400  # test images: every accuracy above is a whole number of them
SPREAD = (0.99, 1.01, 0.995, 1.005)  # each run's four steady epochs around its images/s, whose mean it is


@pytest.fixture
def layout(tmp_path) -> Layout:
    layout = Layout(tmp_path)
    for variant, (ips, acc) in MEASURED.items():
        train = {"epoch_seconds": 12.5, "images_per_second": ips, "peak_memory_mb": 512.0}
        more = {"first_epoch_seconds": 20.0, "world_size": 1, "device_count": 1, "warnings": [],
                "device": "Hand-made GPU", "torch_version": "9.9",
                "speed_samples": {"kind": "epochs", "images_per_second": [ips * f for f in SPREAD]}}
        right = round(acc * IMAGES)  # the first `right` images classified right: the same ones as single-fp32's 200
        correct = "1" * right + "0" * (IMAGES - right)
        for path, obj in ((layout.train_metrics(variant), train), (layout.train_diagnostics(variant), more),
                          (layout.eval_metrics(variant), {"test_accuracy": acc, "test_images": IMAGES}),
                          (layout.eval_diagnostics(variant), {"correct": correct})):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(obj))
    return layout


def test_every_row_has_its_own_speedup_and_accuracy_change_against_single_fp32(layout):
    table = compare(layout)
    assert list(table["variants"]) == list(VARIANTS)
    got = {v: (r["speedup"], r["accuracy_change"]) for v, r in table["variants"].items()}
    assert got == EXPECTED
    assert {v: (r["images_per_second"], r["test_accuracy"]) for v, r in table["variants"].items()} == MEASURED


def test_the_baseline_is_single_fp32_wherever_it_stands_in_the_order(layout):
    order = ("dp-amp", "ddp-bf16", "single-fp32", "dp-fp32")
    table = compare(layout, order)
    assert [(v, r["speedup"], r["accuracy_change"]) for v, r in table["variants"].items()] == [
        ("dp-amp", 2.5, -0.25), ("ddp-bf16", 4.125, 0.5), ("single-fp32", 1.0, 0.0), ("dp-fp32", 0.8, 2.0)]
    with pytest.raises(FasttrainError, match="the baseline single-fp32 is not among the compared variants"):
        compare(layout, ("dp-amp", "ddp-bf16"))


def test_the_intervals_and_verdicts_by_hand(layout):
    """Four epochs at 0.99, 1.01, 0.995 and 1.005 of the mean: a relative sd of 0.00913, so a speed-up's
    log has se sqrt(2) * 0.00913 / 2 = 0.00645 on 6 degrees of freedom (t 2.447): +-1.58%. An accuracy
    change of k of 400 images, all one way, has a paired half-width of 1.96 * sqrt(k/400 * (1 - k/400) * 400/399 / 400)."""
    rows = compare(layout)["variants"]
    amp = rows["dp-amp"]  # 2.5x; 1 image of 400 lost: -0.25 points +- 0.49
    assert amp["speedup_low"] == pytest.approx(2.5 * math.exp(-2.447 * 0.006455), abs=0.001)
    assert amp["speedup_high"] == pytest.approx(2.5 * math.exp(2.447 * 0.006455), abs=0.001)
    half = 1.96 * math.sqrt(1 / 400 * (1 - 1 / 400) * 400 / 399 / 400)
    assert (amp["accuracy_change_low"], amp["accuracy_change_high"]) == pytest.approx(
        (-0.25 - 100 * half, -0.25 + 100 * half), abs=0.006)
    assert (amp["speed"], amp["accuracy"], amp["accuracy_interval"]) == ("faster", "the same", "paired")
    assert (rows["ddp-autocast"]["speed"], rows["ddp-autocast"]["accuracy"]) == ("slower", "lower")
    assert (rows["dp-bf16"]["speed"], rows["dp-bf16"]["accuracy"]) == ("faster", "higher")  # +21 images
    assert (rows["single-fp32"]["speed"], rows["single-fp32"]["accuracy"]) == ("baseline", "baseline")
    base = rows["single-fp32"]  # 1x and +0 by definition: its own images/s has an interval, nothing against itself
    assert "images_per_second_low" in base and not {"speedup_low", "accuracy_change_low", "accuracy_interval"} & set(base)
    mean = rows["dp-fp32"]  # images/s: the mean of its epochs, +- t(3) * sd / 2
    assert mean["images_per_second_high"] - mean["images_per_second"] == pytest.approx(3.182 * 800 * 0.009129 / 2,
                                                                                       abs=0.1)
    same = rows["single-bf16"]  # 1% faster by its point figure, inside its +-1.58%; the same 200 images right
    assert (same["speed"], same["accuracy"]) == ("no different", "the same")


def test_without_per_image_results_or_speed_samples_the_intervals_are_wider_or_none(layout):
    layout.eval_diagnostics("dp-amp").unlink()  # records from before per-image results: two binomial intervals
    _diagnose(layout, "ddp-amp", speed_samples={"kind": "windows", "images_per_second": [3500.0]})
    rows = compare(layout)["variants"]
    amp = rows["dp-amp"]
    half = 1.96 * math.sqrt((0.5 * 0.5 + 0.4975 * 0.5025) / 400)
    assert amp["accuracy_interval"] == "unpaired" and amp["accuracy_change_high"] == pytest.approx(-0.25 + 100 * half,
                                                                                                  abs=0.006)
    assert amp["accuracy"] == "the same"
    one = rows["ddp-amp"]  # one window: no spread, so no interval and no speed verdict
    assert "speedup_low" not in one and one["speed"] is None and one["speed_samples"] == 1
    assert "| ddp-amp | 12.50 | 20.00 | 3,500 | 512 | 0.5000 | 3.50x | +0.00 (+0.00 to +0.00) | speed not decided " \
           "(1 sample(s)), accuracy the same |" in to_markdown(compare(layout))


def test_the_markdown_rows_say_the_same(layout):
    markdown = to_markdown(compare(layout))
    assert "| dp-amp | 12.50 | 20.00 | 2,500 ± 36 | 512 | 0.4975 | 2.50x (2.46–2.54) | -0.25 (-0.74 to +0.24) " \
           "| faster, accuracy the same |" in markdown
    assert "| ddp-autocast | 12.50 | 20.00 | 400 ± 6 | 512 | 0.1000 | 0.40x (0.39–0.41) | -40.00 (-44.81 to -35.19) " \
           "| slower, accuracy lower |" in markdown
    assert "| single-fp32 | 12.50 | 20.00 | 1,000 ± 14 | 512 | 0.5000 | 1.00x | +0.00 | baseline |" in markdown
    assert "Device: Hand-made GPU; torch 9.9; speed-up and accuracy change against single-fp32." in markdown
    assert "Intervals are 95%" in markdown


def _diagnose(layout, variant: str, **fields) -> None:
    path = layout.train_diagnostics(variant)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_cpus_table_says_its_speeds_are_a_cpus_and_what_its_memory_measured(layout):
    for variant in VARIANTS:
        _diagnose(layout, variant, peak_memory_kind="cpu_max_rss")
    head = to_markdown(compare(layout)).splitlines()[0]
    assert head == ("| variant | s/epoch | first epoch s | images/s (CPU) | peak process memory (RSS) MB | test acc "
                    "| speed-up (CPU) | acc change (pp) | verdict |")
    for variant in VARIANTS:
        _diagnose(layout, variant, peak_memory_kind="cuda_max_allocated")
    head = to_markdown(compare(layout)).splitlines()[0]
    assert "| images/s | peak GPU memory (allocated) MB |" in head and "| speed-up |" in head


def test_each_warning_is_listed_once_with_the_variants_it_applies_to(layout):
    for variant in VARIANTS:
        _diagnose(layout, variant, warnings=["the CPU runs eagerly"] + (["dp: one device"] if variant.startswith("dp-") else []))
    table = compare(layout)
    dp = [v for v in VARIANTS if v.startswith("dp-")]
    assert table["warnings"] == [{"warning": "the CPU runs eagerly", "variants": list(VARIANTS)},
                                 {"warning": "dp: one device", "variants": dp}]
    notes = [line for line in to_markdown(table).splitlines() if line.startswith("- ")]
    assert notes == ["- the CPU runs eagerly: every variant", f"- dp: one device: {', '.join(dp)}"]


def test_dvc_reads_every_figure_of_every_variant_as_a_metric(layout):
    """A mapping, not a list (which DVC's metrics skip): variants.<variant>.<figure>, numbers and the
    verdicts' words, which `dvc metrics diff` prints as they are."""
    table = compare(layout)
    flat = {f"variants.{v}.{k}": x for v, r in table["variants"].items() for k, x in r.items()}
    words = {k: x for k, x in flat.items() if isinstance(x, str)}
    assert set(words.values()) <= {"faster", "slower", "no different", "the same", "lower", "higher", "baseline",
                                   "paired"}
    # 21 figures a variant; the baseline 16, without its speed-up and accuracy change's ends and pairing
    assert len(flat) == (len(VARIANTS) - 1) * 21 + 16 and all(isinstance(x, (int, float)) for k, x in flat.items() if k not in words)


def test_per_image_results_of_different_test_sets_are_refused_in_one_line(layout):
    layout.eval_diagnostics("dp-amp").write_text(json.dumps({"correct": "1" * 399}))
    with pytest.raises(FasttrainError, match=r"^dp-amp and single-fp32 were evaluated on different test sets "
                                             r"\(399 and 400 images\)"):
        compare(layout)


def _seed_run(layout: Layout, seed: int, accuracy: dict[str, float], speed: float = 1.0) -> None:
    """Seed `seed`'s runs: each variant as MEASURED, its images/s times `speed`, its accuracy as given."""
    seeded = layout.for_seed(seed)
    for variant, (ips, _) in MEASURED.items():
        for kind in ("train_metrics", "train_diagnostics", "eval_metrics", "eval_diagnostics"):
            path = getattr(seeded, kind)(variant)
            path.parent.mkdir(parents=True, exist_ok=True)
            obj = json.loads(getattr(layout, kind)(variant).read_text())
            if kind == "train_metrics":
                obj["images_per_second"] = ips * speed
            if kind == "train_diagnostics":
                obj["speed_samples"]["images_per_second"] = [ips * speed * f for f in SPREAD]
            if kind == "eval_metrics":
                obj["test_accuracy"] = accuracy.get(variant, MEASURED[variant][1])
            if kind == "eval_diagnostics":
                right = round(accuracy.get(variant, MEASURED[variant][1]) * IMAGES)
                obj["correct"] = "1" * right + "0" * (IMAGES - right)
            path.write_text(json.dumps(obj))


def test_over_three_seeds_each_figure_is_their_mean_and_the_accuracy_change_covers_their_spread(layout):
    """single-amp loses 1.25 points in seed 0 (as MEASURED), gains 1.25 in seed 1 and 0 in seed 2: its
    mean change is 0, and however narrow each seed's paired interval, the interval over the seeds is
    t(2) = 4.303 times their standard error, 4.303 * 1.25 / sqrt(3) = 3.105 points each way."""
    _seed_run(layout, 1, {"single-amp": 0.5125}, speed=1.1)
    _seed_run(layout, 2, {"single-amp": 0.50}, speed=0.9)
    table = compare(layout, seeds=(0, 1, 2))
    amp, base = table["variants"]["single-amp"], table["variants"]["single-fp32"]
    assert table["seeds"] == [0, 1, 2] and amp["seeds"] == base["seeds"] == 3
    assert amp["test_accuracy"] == 0.5 and amp["test_accuracy_spread"] == 0.0125
    assert amp["images_per_second"] == 1500.0 and amp["speed_samples"] == 12  # the mean; every seed's epochs
    assert (amp["accuracy_change"], amp["accuracy_interval"]) == (0.0, "paired")
    assert (amp["accuracy_change_low"], amp["accuracy_change_high"]) == pytest.approx((-3.105, 3.105), abs=0.006)
    assert amp["accuracy"] == "the same"
    assert "test_accuracy_spread" not in compare(layout)["variants"]["single-amp"]  # one seed: no spread
    markdown = to_markdown(table)
    assert "| 0.5000 ± 0.0125 |" in markdown and "Over 3 seeds (0, 1, 2): each figure is the mean" in markdown
    # speed over seeds: 1.1 and 0.9 of seed 0's scatter the baseline's samples as much as the variant's,
    # so 1.5x stays 1.5x, its interval wider than one seed's
    one = compare(layout)["variants"]["single-amp"]
    assert amp["speedup"] == 1.5 and amp["speedup_low"] < one["speedup_low"] < 1.5 < one["speedup_high"] < amp["speedup_high"]


def test_a_seed_without_its_runs_is_one_line_naming_the_file(layout):
    with pytest.raises(FasttrainError, match=r"seed1/single-fp32.json not found; run the train and evaluate stages"):
        compare(layout, seeds=(0, 1))
