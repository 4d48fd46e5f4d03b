"""The comparison table against a hand-made case whose answers are worked out below, not computed."""

import json

import pytest

from fasttrain.compare import compare, to_markdown
from fasttrain.errors import FasttrainError
from fasttrain.layout import VARIANTS, Layout

# variant: (images/s, test accuracy) as its train and eval metrics files say; every row differs, so
# a row that read another variant's files would show.
MEASURED = {
    "single-fp32": (1000.0, 0.50), "single-autocast": (1250.0, 0.51), "single-amp": (1500.0, 0.4875),
    "single-bf16": (2000.0, 0.50), "dp-fp32": (800.0, 0.52), "dp-autocast": (900.0, 0.45),
    "dp-amp": (2500.0, 0.4975), "dp-bf16": (3000.0, 0.5525), "ddp-fp32": (1750.0, 0.49),
    "ddp-autocast": (400.0, 0.10), "ddp-amp": (3500.0, 0.5), "ddp-bf16": (4125.0, 0.505),
}
# variant: (speed-up over single-fp32, accuracy change in percentage points), by hand
EXPECTED = {
    "single-fp32": (1.0, 0.0), "single-autocast": (1.25, 1.0), "single-amp": (1.5, -1.25),
    "single-bf16": (2.0, 0.0), "dp-fp32": (0.8, 2.0), "dp-autocast": (0.9, -5.0),
    "dp-amp": (2.5, -0.25), "dp-bf16": (3.0, 5.25), "ddp-fp32": (1.75, -1.0),
    "ddp-autocast": (0.4, -40.0), "ddp-amp": (3.5, 0.0), "ddp-bf16": (4.125, 0.5),
}


@pytest.fixture
def layout(tmp_path) -> Layout:
    layout = Layout(tmp_path)
    for variant, (ips, acc) in MEASURED.items():
        train = {"epoch_seconds": 12.5, "images_per_second": ips, "peak_memory_mb": 512.0}
        more = {"first_epoch_seconds": 20.0, "world_size": 1, "device_count": 1, "warnings": [],
                "device": "Hand-made GPU", "torch_version": "9.9"}
        for path, obj in ((layout.train_metrics(variant), train), (layout.train_diagnostics(variant), more),
                          (layout.eval_metrics(variant), {"test_accuracy": acc})):
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


def test_the_markdown_rows_say_the_same(layout):
    markdown = to_markdown(compare(layout))
    assert "| dp-amp | 12.50 | 20.00 | 2,500 | 512 | 0.4975 | 2.50x | -0.25 |" in markdown
    assert "| ddp-autocast | 12.50 | 20.00 | 400 | 512 | 0.1000 | 0.40x | -40.00 |" in markdown
    assert "| single-fp32 | 12.50 | 20.00 | 1,000 | 512 | 0.5000 | 1.00x | +0.00 |" in markdown
    assert "Device: Hand-made GPU; torch 9.9; speed-up and accuracy change against single-fp32." in markdown


def _diagnose(layout, variant: str, **fields) -> None:
    path = layout.train_diagnostics(variant)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_cpus_table_says_its_speeds_are_a_cpus_and_what_its_memory_measured(layout):
    for variant in VARIANTS:
        _diagnose(layout, variant, peak_memory_kind="cpu_max_rss")
    head = to_markdown(compare(layout)).splitlines()[0]
    assert head == ("| variant | s/epoch | first epoch s | images/s (CPU) | peak process memory (RSS) MB | test acc "
                    "| speed-up (CPU) | acc change (pp) |")
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
    """A mapping, not a list (which DVC's metrics skip): variants.<variant>.<figure>, numbers."""
    table = compare(layout)
    flat = {f"variants.{v}.{k}": x for v, r in table["variants"].items() for k, x in r.items()}
    assert len(flat) == len(VARIANTS) * 9 and all(isinstance(x, (int, float)) for x in flat.values())
