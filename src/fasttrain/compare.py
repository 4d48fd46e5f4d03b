"""Compare every variant against single-fp32: one table, as Markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fasttrain import atomic
from fasttrain.errors import FasttrainError
from fasttrain.layout import BASELINE, VARIANTS, Layout

COLUMNS = (  # key, header, format
    ("variant", "variant", "{}"),
    ("epoch_seconds", "s/epoch", "{:.2f}"),
    ("first_epoch_seconds", "first epoch s", "{:.2f}"),
    ("images_per_second", "images/s", "{:,.0f}"),
    ("peak_memory_mb", "peak memory MB", "{:,.0f}"),
    ("test_accuracy", "test acc", "{:.4f}"),
    ("speedup", "speed-up", "{:.2f}x"),
    ("accuracy_change", "acc change (pp)", "{:+.2f}"),
)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FasttrainError(f"{path} not found; run the train and evaluate stages first (dvc repro)") from None
    except json.JSONDecodeError as e:
        raise FasttrainError(f"{path} is not valid JSON: {e}") from None


def compare(layout: Layout, variants: tuple[str, ...] = VARIANTS) -> dict:
    rows = []
    for variant in variants:
        tr, ev = _read(layout.train_metrics(variant)), _read(layout.eval_metrics(variant))
        more = _read(layout.train_diagnostics(variant))
        rows.append({"variant": variant, "epoch_seconds": tr["epoch_seconds"],
                     "first_epoch_seconds": more["first_epoch_seconds"], "images_per_second": tr["images_per_second"],
                     "peak_memory_mb": tr["peak_memory_mb"], "test_accuracy": ev["test_accuracy"],
                     "world_size": more["world_size"], "device_count": more["device_count"],
                     "warnings": more.get("warnings", [])})
    base = next((r for r in rows if r["variant"] == BASELINE), None)
    if base is None:
        raise FasttrainError(f"the baseline {BASELINE} is not among the compared variants: {', '.join(variants)}")
    for r in rows:
        r["speedup"] = round(r["images_per_second"] / base["images_per_second"], 3)
        r["accuracy_change"] = round(100 * (r["test_accuracy"] - base["test_accuracy"]), 2)
    first = _read(layout.train_diagnostics(variants[0]))
    return {"baseline": BASELINE, "device": first["device"], "torch_version": first["torch_version"],
            "rows": rows}


PLOT_COLUMNS = ("variant", "images_per_second", "peak_memory_mb", "epoch_seconds", "test_accuracy")


def to_plot_csv(table: dict) -> str:
    """One row per variant, for the bar charts of `dvc plots show`."""
    lines = [",".join(PLOT_COLUMNS)]
    lines += [",".join(str(r[k]) for k in PLOT_COLUMNS) for r in table["rows"]]
    return "\n".join(lines) + "\n"


def to_markdown(table: dict) -> str:
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if k == "variant" else "---:" for k, _, _ in COLUMNS) + "|"
    lines = [head, rule]
    for r in table["rows"]:
        lines.append("| " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |")
    notes = [f"- {r['variant']}: {w}" for r in table["rows"] for w in r["warnings"]]
    footer = [f"Device: {table['device']}; torch {table['torch_version']}; "
              f"speed-up and accuracy change against {table['baseline']}."]
    return "\n".join(lines + [""] + footer + ([""] + notes if notes else [])) + "\n"


@click.command("compare")
def main() -> None:
    """Read every variant's metrics; write metrics/compare.md, metrics/compare.json and plots/compare.csv."""
    layout = Layout()
    table = compare(layout)
    markdown = to_markdown(table)
    atomic.atomic_write_json(layout.compare_json, table, "the comparison")
    atomic.atomic_write_text(layout.compare_md, markdown, "the comparison table")
    atomic.atomic_write_text(layout.compare_plot, to_plot_csv(table), "the comparison plot")
    click.echo(markdown)
