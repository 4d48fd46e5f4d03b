"""Compare every variant against single-fp32: one table, as Markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fasttrain import atomic
from fasttrain.errors import FasttrainError
from fasttrain.layout import BASELINE, VARIANTS, Layout

COLUMNS = (  # key, header, format; headers in {} are filled by the device kind (_headers)
    ("variant", "variant", "{}"),
    ("epoch_seconds", "s/epoch", "{:.2f}"),
    ("first_epoch_seconds", "first epoch s", "{:.2f}"),
    ("images_per_second", "images/s{on}", "{:,.0f}"),
    ("peak_memory_mb", "{memory} MB", "{:,.0f}"),
    ("test_accuracy", "test acc", "{:.4f}"),
    ("speedup", "speed-up{on}", "{:.2f}x"),
    ("accuracy_change", "acc change (pp)", "{:+.2f}"),
)
# what train's peak_memory_mb measured (its peak_memory_kind), as the table's header names it
MEMORY = {"cuda_max_allocated": "peak GPU memory (allocated)", "cpu_max_rss": "peak process memory (RSS)"}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FasttrainError(f"{path} not found; run the train and evaluate stages first (dvc repro)") from None
    except json.JSONDecodeError as e:
        raise FasttrainError(f"{path} is not valid JSON: {e}") from None


def compare(layout: Layout, variants: tuple[str, ...] = VARIANTS) -> dict:
    """Every variant's figures against single-fp32's, by variant: a mapping, so that DVC reads each
    figure as a metric (`dvc metrics diff` shows a speed-up that moved). Warnings are listed once
    each, with the variants they apply to."""
    rows, warned, diagnostics = {}, {}, {}
    for variant in variants:
        tr, ev = _read(layout.train_metrics(variant)), _read(layout.eval_metrics(variant))
        more = diagnostics[variant] = _read(layout.train_diagnostics(variant))
        rows[variant] = {"epoch_seconds": tr["epoch_seconds"], "first_epoch_seconds": more["first_epoch_seconds"],
                         "images_per_second": tr["images_per_second"], "peak_memory_mb": tr["peak_memory_mb"],
                         "test_accuracy": ev["test_accuracy"], "world_size": more["world_size"],
                         "device_count": more["device_count"]}
        for warning in more.get("warnings", []):
            warned.setdefault(warning, []).append(variant)
    base = rows.get(BASELINE)
    if base is None:
        raise FasttrainError(f"the baseline {BASELINE} is not among the compared variants: {', '.join(variants)}")
    for r in rows.values():
        r["speedup"] = round(r["images_per_second"] / base["images_per_second"], 3)
        r["accuracy_change"] = round(100 * (r["test_accuracy"] - base["test_accuracy"]), 2)
    first, kinds = diagnostics[variants[0]], {d.get("peak_memory_kind") for d in diagnostics.values()}
    return {"baseline": BASELINE, "device": first["device"], "torch_version": first["torch_version"],
            "peak_memory_kind": kinds.pop() if len(kinds) == 1 else "mixed",
            "variants": rows, "warnings": [{"warning": w, "variants": vs} for w, vs in warned.items()]}


PLOT_COLUMNS = ("variant", "images_per_second", "peak_memory_mb", "epoch_seconds", "test_accuracy")


def to_plot_csv(table: dict) -> str:
    """One row per variant, for the bar charts of `dvc plots show`."""
    lines = [",".join(PLOT_COLUMNS)]
    lines += [",".join(str({"variant": v, **r}[k]) for k in PLOT_COLUMNS) for v, r in table["variants"].items()]
    return "\n".join(lines) + "\n"


def _headers(table: dict) -> list[str]:
    on = " (CPU)" if table["peak_memory_kind"] == "cpu_max_rss" else ""  # a CPU's speeds say so
    memory = MEMORY.get(table["peak_memory_kind"], "peak memory")
    return [h.format(on=on, memory=memory) for _, h, _ in COLUMNS]


def to_markdown(table: dict) -> str:
    head = "| " + " | ".join(_headers(table)) + " |"
    rule = "|" + "|".join("---" if k == "variant" else "---:" for k, _, _ in COLUMNS) + "|"
    lines = [head, rule]
    for variant, r in table["variants"].items():
        r = {"variant": variant, **r}
        lines.append("| " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |")
    every = len(table["variants"])
    notes = [f"- {w['warning']}: " + ("every variant" if len(w["variants"]) == every and every > 1
                                      else ", ".join(w["variants"])) for w in table["warnings"]]
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
