"""Compare every variant against single-fp32: one table, as Markdown and JSON."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from statistics import fmean, stdev

import click

from fasttrain import atomic, config, stats
from fasttrain.errors import FasttrainError
from fasttrain.layout import BASELINE, VARIANTS, Layout

COLUMNS = (  # key, header, format; headers in {} are filled by the device kind (_headers)
    ("variant", "variant", "{}"),
    ("epoch_seconds", "s/epoch", "{:.2f}"),
    ("first_epoch_seconds", "first epoch s", "{:.2f}"),
    ("images_per_second", "images/s{on}", None),
    ("peak_memory_mb", "{memory} MB", "{:,.0f}"),
    ("test_accuracy", "test acc", None),
    ("speedup", "speed-up{on}", None),
    ("accuracy_change", "acc change (pp)", None),
    ("verdict", "verdict", None),
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


def _optional(path: Path) -> dict:
    return _read(path) if path.is_file() else {}


def _with_interval(row: dict, key: str, iv: stats.Interval | None, digits: int) -> stats.Interval | None:
    """The row's figure as it is, and the interval's ends at the interval's relative width around it
    (an accuracy change's interval is around the same figure already)."""
    if iv is None:
        return None
    iv = iv.around(row[key]) if row[key] and iv.value else iv
    row[f"{key}_low"], row[f"{key}_high"] = round(iv.low, digits), round(iv.high, digits)
    return iv


def _run(layout: Layout, variant: str) -> tuple[dict, dict, list[float], str | None]:
    """One seed's run of a variant: its row's figures, its diagnostics, its steady speed samples and its
    per-image results ("1" right, "0" wrong; None in a record without them)."""
    tr, ev = _read(layout.train_metrics(variant)), _read(layout.eval_metrics(variant))
    more = _read(layout.train_diagnostics(variant))
    row = {"epoch_seconds": tr["epoch_seconds"], "first_epoch_seconds": more["first_epoch_seconds"],
           "images_per_second": tr["images_per_second"], "peak_memory_mb": tr["peak_memory_mb"],
           "test_accuracy": ev["test_accuracy"], "test_images": ev.get("test_images"),
           "world_size": more["world_size"], "device_count": more["device_count"]}
    samples = (more.get("speed_samples") or {}).get("images_per_second", [])
    return row, more, samples, _optional(layout.eval_diagnostics(variant)).get("correct")


def _over_seeds(runs: list[dict]) -> dict:
    """A variant's row from its seeds' runs: one run's figures as they are; several runs' means (the
    largest peak memory) and the accuracy's spread over the seeds (their standard deviation)."""
    if len(runs) == 1:
        return {**runs[0], "seeds": 1}
    row = {**runs[0], "seeds": len(runs), "peak_memory_mb": max(r["peak_memory_mb"] for r in runs)}
    for key, digits in (("epoch_seconds", 3), ("first_epoch_seconds", 3), ("images_per_second", 1),
                        ("test_accuracy", 4)):
        row[key] = round(fmean(r[key] for r in runs), digits)
    row["test_accuracy_spread"] = round(stdev(r["test_accuracy"] for r in runs), 4)
    return row


def _accuracy_change(variant: str, seeds: tuple[int, ...], runs: dict,
                     correct: dict) -> tuple[stats.Interval | None, str | None]:
    """The accuracy change against the baseline, seed by seed (paired over the test images where both
    runs kept each image's result, else as two independent accuracies), then over the seeds."""
    changes, kinds = [], set()
    for seed in seeds:
        mine, base = correct[variant, seed], correct[BASELINE, seed]
        if mine and base:
            if len(mine) != len(base):
                raise FasttrainError(f"{variant} and {BASELINE} were evaluated on different test sets "
                                     f"({len(mine)} and {len(base)} images): evaluate both on the same data (dvc repro)")
            changes.append(stats.paired_change(base, mine))
            kinds.add("paired")
        else:
            r, b = runs[variant, seed], runs[BASELINE, seed]
            if not r["test_images"]:
                return None, None
            changes.append(stats.unpaired_change(b["test_accuracy"], r["test_accuracy"], r["test_images"]))
            kinds.add("unpaired")
    return stats.over_seeds(changes), kinds.pop() if len(kinds) == 1 else "mixed"


def compare(layout: Layout, variants: tuple[str, ...] = VARIANTS, seeds: tuple[int, ...] = (0,)) -> dict:
    """Every variant's figures against single-fp32's over the runs of `seeds`, by variant: a mapping, so
    that DVC reads each figure as a metric (`dvc metrics diff` shows a speed-up that moved). Speed,
    speed-up and accuracy change come with their 95% intervals and the verdicts read from them
    (fasttrain.stats): a speed from every seed's steady samples together, an accuracy change from each
    seed's against the baseline's run of the same seed, its interval widened to the seeds' spread.
    Warnings are listed once each, with the variants they apply to."""
    if BASELINE not in variants:
        raise FasttrainError(f"the baseline {BASELINE} is not among the compared variants: {', '.join(variants)}")
    runs, warned, diagnostics, samples, correct = {}, {}, {}, {}, {}
    for variant in variants:
        samples[variant] = []
        for seed in seeds:
            row, more, steady, correct[variant, seed] = _run(layout.for_seed(seed), variant)
            runs[variant, seed], diagnostics[variant, seed] = row, more
            samples[variant] += steady
            for warning in more.get("warnings", []):
                if variant not in warned.setdefault(warning, []):
                    warned[warning].append(variant)
    rows = {variant: _over_seeds([runs[variant, seed] for seed in seeds]) for variant in variants}
    base = rows[BASELINE]
    for variant, r in rows.items():
        _with_interval(r, "images_per_second", stats.mean_interval(samples[variant]), 1)
        r["speedup"] = round(r["images_per_second"] / base["images_per_second"], 3)
        r["accuracy_change"] = round(100 * (r["test_accuracy"] - base["test_accuracy"]), 2)
        r["speed_samples"] = len(samples[variant])
        if variant == BASELINE:  # 1x and +0 by definition: no interval, no verdict against itself
            r["speed"] = r["accuracy"] = "baseline"
            continue
        speedup = _with_interval(r, "speedup", stats.ratio_interval(samples[variant], samples[BASELINE]), 3)
        r["speed"] = stats.speed_verdict(speedup)
        change, kind = _accuracy_change(variant, seeds, runs, correct)
        if change is not None:
            r["accuracy_interval"] = kind
            r["accuracy_change_low"], r["accuracy_change_high"] = round(change.low, 2), round(change.high, 2)
        r["accuracy"] = stats.accuracy_verdict(change)
    first, kinds = diagnostics[variants[0], seeds[0]], {d.get("peak_memory_kind") for d in diagnostics.values()}
    sample_kinds = {(d.get("speed_samples") or {}).get("kind") for d in diagnostics.values()} - {None}
    return {"baseline": BASELINE, "seeds": list(seeds), "device": first["device"],
            "torch_version": first["torch_version"],
            "peak_memory_kind": kinds.pop() if len(kinds) == 1 else "mixed",
            "speed_samples": sample_kinds.pop() if len(sample_kinds) == 1 else "mixed" if sample_kinds else None,
            "variants": rows, "warnings": [{"warning": w, "variants": vs} for w, vs in warned.items()]}


def verdict(r: dict) -> str:
    """The row's verdict in words, from its intervals: "faster, accuracy the same"."""
    if r["speed"] == "baseline":
        return "baseline"
    speed = r["speed"] or f"speed not decided ({r['speed_samples']} sample(s))"
    return f"{speed}, accuracy {r['accuracy'] or 'not decided (no test images recorded)'}"


def _cell(key: str, r: dict) -> str:
    low, high = r.get(f"{key}_low"), r.get(f"{key}_high")
    if key == "images_per_second":
        return f"{r[key]:,.0f}" + (f" ± {(high - low) / 2:,.0f}" if low is not None else "")
    if key == "speedup":
        return f"{r[key]:.2f}x" + (f" ({low:.2f}–{high:.2f})" if low is not None else "")
    if key == "test_accuracy":  # over several seeds: their mean ± their standard deviation
        spread = r.get("test_accuracy_spread")
        return f"{r[key]:.4f}" + (f" ± {spread:.4f}" if spread is not None else "")
    if key == "accuracy_change":
        return f"{r[key]:+.2f}" + (f" ({low:+.2f} to {high:+.2f})" if low is not None else "")
    return verdict(r)


INTERVALS = ("Intervals are 95%. Images/s: Student's t over the run's steady samples (its epochs after the first, "
             "or windows of steps when it has fewer than four epochs), as a share of the figure; speed-up: Welch's "
             "on the log of the ratio; accuracy change: paired over the test images both models classified. A "
             "verdict says faster, slower, lower or higher only when the whole interval does; otherwise no "
             "different, or the same.")
SEEDS = ("Over {n} seeds ({seeds}): each figure is the mean of the seeds' runs (peak memory: the largest), test acc "
         "their mean ± standard deviation; images/s and speed-up take every seed's steady samples together; the "
         "accuracy change is each seed's against single-fp32's run of that seed, its interval the wider of the "
         "seeds' t interval (the seed's spread) and their paired intervals pooled.")


PLOT_COLUMNS = ("variant", "images_per_second", "images_per_second_low", "images_per_second_high", "peak_memory_mb",
                "epoch_seconds", "test_accuracy", "test_accuracy_spread", "seeds", "speedup", "speedup_low",
                "speedup_high", "accuracy_change", "accuracy_change_low", "accuracy_change_high", "verdict")


def to_plot_csv(table: dict) -> str:
    """One row per variant, for the bar charts of `dvc plots show` (an interval's ends empty where
    there is none: the bar is drawn without its error bar)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(PLOT_COLUMNS)
    for v, r in table["variants"].items():
        cells = {**r, "variant": v, "verdict": verdict(r)}
        w.writerow(["" if cells.get(k) is None else cells[k] for k in PLOT_COLUMNS])
    return out.getvalue()


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
        lines.append("| " + " | ".join(fmt.format(r[k]) if fmt else _cell(k, r) for k, _, fmt in COLUMNS) + " |")
    every = len(table["variants"])
    notes = [f"- {w['warning']}: " + ("every variant" if len(w["variants"]) == every and every > 1
                                      else ", ".join(w["variants"])) for w in table["warnings"]]
    footer = [f"Device: {table['device']}; torch {table['torch_version']}; "
              f"speed-up and accuracy change against {table['baseline']}.", "", INTERVALS]
    seeds = table.get("seeds") or [0]
    if len(seeds) > 1:
        footer += ["", SEEDS.format(n=len(seeds), seeds=", ".join(map(str, seeds)))]
    return "\n".join(lines + [""] + footer + ([""] + notes if notes else [])) + "\n"


@click.command("compare")
def main() -> None:
    """Read every variant's metrics, each seed's of compare.seeds; write metrics/compare.md, metrics/compare.json
    and plots/compare.csv."""
    layout = Layout()
    table = compare(layout, seeds=tuple(config.load("params.yaml").compare.seeds))
    markdown = to_markdown(table)
    atomic.atomic_write_json(layout.compare_json, table, "the comparison")
    atomic.atomic_write_text(layout.compare_md, markdown, "the comparison table")
    atomic.atomic_write_text(layout.compare_plot, to_plot_csv(table), "the comparison plot")
    click.echo(markdown)
