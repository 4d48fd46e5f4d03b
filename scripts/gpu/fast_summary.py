"""Summarise fast-recipe runs from `scripts/gpu/fast.sh` output folders, as a Markdown table.

    python scripts/gpu/fast_summary.py OUTDIR [OUTDIR ...] [--mark 0.84] [--runs] [--configs "C1 C2 ..."]

One row per configuration (the overrides string of the runs): how many runs, how many ended below
MARK, test accuracy min / median / max, the loss change at the switch to the final size (the first
epoch at the last size's mean train loss over the epoch before's, from each run's curve), the
runs that collapsed: whose per-epoch test accuracy fell below --collapse after having reached twice
that, and the runs set back: an epoch whose test accuracy fell by more than --setback from the
epoch before's. A run whose curve is missing counts in the accuracy columns only, and the table
says so. With --runs, one row per run instead: its seconds and accuracy. With --wall, one row per
run of where each command's wall time went: the phases of its metrics' `process_seconds`, and
`after` (the wall time past the metrics: the interpreter's exit, the last writes).

Each OUTDIR holds `fast.jsonl` and the curves `epochs-N-SEED.csv`, N numbering the configurations
in the order fast.sh was given them. Rows without N (no "config" field: fast.jsonl files written
before fast.sh recorded it) get it from --configs: the same configurations string fast.sh was given.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path


def load_runs(folder: Path, configs: list[str]) -> list[dict]:
    runs = []
    for line in (folder / "fast.jsonl").read_text().splitlines():
        row = json.loads(line)
        n = row.get("config")
        if n is None:
            if row["overrides"] not in configs:
                sys.exit(f"fast_summary: {folder}: a run of {row['overrides']!r} records no config number "
                         f"and --configs does not list it: give --configs as fast.sh got them")
            n = configs.index(row["overrides"]) + 1
        row["config"] = n
        curve = folder / f"epochs-{n}-{row['seed']}.csv"
        row["curve"] = None
        if curve.exists():
            with open(curve) as f:
                row["curve"] = [{k: float(v) if v else None for k, v in r.items()} for r in csv.DictReader(f)]
        runs.append(row)
    return runs


def switch_change(curve: list[dict]) -> float | None:
    """The first epoch at the final size's train loss over the epoch before's; None without a switch."""
    sizes = [r["img_size"] for r in curve]
    first = sizes.index(sizes[-1])
    return curve[first]["train_loss"] / curve[first - 1]["train_loss"] if first else None


def collapse_epoch(curve: list[dict], below: float) -> int | None:
    """The first epoch whose test accuracy fell below `below` after an earlier one reached 2 x below."""
    reached = False
    for r in curve:
        if reached and r["test_accuracy"] < below:
            return int(r["epoch"])
        reached = reached or r["test_accuracy"] >= 2 * below
    return None


def largest_drop(curve: list[dict]) -> tuple[int, float]:
    """The epoch whose test accuracy fell most from the epoch before's, and by how much (0: never)."""
    drops = [(int(b["epoch"]), a["test_accuracy"] - b["test_accuracy"]) for a, b in zip(curve, curve[1:])]
    return max(drops, key=lambda d: d[1], default=(0, 0.0))


def config_table(runs: list[dict], mark: float, below: float, setback: float = 0.1) -> list[str]:
    lines = [f"| configuration | runs | below {mark} | test accuracy min / median / max | loss at the switch | "
             f"collapses (seed: epoch) | set back by > {setback} (seed: epoch, change) |", "|---|---:|---:|---|---|---|---|"]
    for overrides in dict.fromkeys(r["overrides"] for r in sorted(runs, key=lambda r: r["config"])):
        mine = sorted((r for r in runs if r["overrides"] == overrides), key=lambda r: r["seed"])
        acc = [r["test_accuracy"] for r in mine]
        curved = [r for r in mine if r["curve"] is not None]
        changes = [c for c in map(switch_change, (r["curve"] for r in curved)) if c is not None]
        change = f"×{min(changes):.2f} to ×{max(changes):.2f}" if changes else "(no switch)"
        collapses = [(r["seed"], collapse_epoch(r["curve"], below)) for r in curved]
        collapsed = "; ".join(f"{s}: epoch {e}" for s, e in collapses if e is not None) or "none"
        drops = [(r["seed"], *largest_drop(r["curve"])) for r in curved]
        set_back = "; ".join(f"{s}: epoch {e}, -{d:.2f}" for s, e, d in drops if d > setback) or "none"
        if len(curved) < len(mine):
            missing = ", ".join(str(r["seed"]) for r in mine if r["curve"] is None)
            set_back += f" (no curve for seed {missing})"
        lines.append(f"| `{overrides}` | {len(acc)} | {sum(a < mark for a in acc)} | {min(acc):.4f} / "
                     f"{statistics.median(acc):.4f} / {max(acc):.4f} | {change} | {collapsed} | {set_back} |")
    return lines


def run_table(runs: list[dict]) -> list[str]:
    lines = ["| seed | configuration | runs sharing the GPU | train s | compile s (apart) | images/s | test accuracy |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted(runs, key=lambda r: (r["config"], r["seed"])):
        compile_s = "" if r["compile_seconds"] is None else f"{r['compile_seconds']:.2f}"
        lines.append(f"| {r['seed']} | `{r['overrides']}` | {r.get('jobs', 1)} | {r['train_seconds']:.2f} | "
                     f"{compile_s} | {r['images_per_second']:,.0f} | {r['test_accuracy']:.4f} |")
    return lines


TRAIN_PHASES = ("start_up", "runtime", "prepare", "warm_up", "train", "eval", "checkpoints", "final_model", "other")
EVALUATE_PHASES = ("start_up", "runtime", "prepare", "eval", "other")


def _from_cache(lookups: dict | None) -> str:
    """"found/looked up" of AOTAutograd's graphs (the train metrics' compile_cache); "" if not recorded."""
    if not lookups:
        return ""
    aot = lookups["aot_autograd"]
    return f"{aot['hit']}/{sum(aot.values())}"


def wall_table(runs: list[dict]) -> list[str]:
    """Seconds by phase of each run's train and evaluate commands (rows of fast.jsonl that record them)."""
    head = (["seed", "train wall"] + [f"train: {p}" for p in TRAIN_PHASES]
            + ["train: after", "checkpoints written", "graphs from the compile cache", "evaluate wall"]
            + [f"evaluate: {p}" for p in EVALUATE_PHASES] + ["evaluate: after"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    timed = [r for r in runs if r.get("train_process_seconds") and r.get("evaluate_process_seconds")]
    for r in sorted(timed, key=lambda r: (r["config"], r["seed"])):
        t, e = r["train_process_seconds"], r["evaluate_process_seconds"]
        cells = ([str(r["seed"]), f"{r['train_wall_seconds']:.2f}"] + [f"{t.get(p, 0.0):.2f}" for p in TRAIN_PHASES]
                 + [f"{r['train_wall_seconds'] - t['total']:.2f}", str(r.get("checkpoints_written", "")),
                    _from_cache(r.get("compile_cache")), f"{r['evaluate_wall_seconds']:.2f}"]
                 + [f"{e.get(p, 0.0):.2f}" for p in EVALUATE_PHASES]
                 + [f"{r['evaluate_wall_seconds'] - e['total']:.2f}"])
        lines.append("| " + " | ".join(cells) + " |")
    if len(timed) < len(runs):
        lines.append(f"\n{len(runs) - len(timed)} run(s) recorded no seconds by phase (fast.jsonl rows from before "
                     f"fast.sh kept them)")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--mark", type=float, default=0.84, help="the test accuracy a run must reach (0.84)")
    ap.add_argument("--collapse", type=float, default=0.2, help="test accuracy that counts as a collapse (0.2)")
    ap.add_argument("--setback", type=float, default=0.1,
                    help="a fall of test accuracy from one epoch to the next that counts as a set-back (0.1)")
    ap.add_argument("--runs", action="store_true", help="one row per run instead of per configuration")
    ap.add_argument("--wall", action="store_true", help="one row per run: each command's wall time by phase")
    ap.add_argument("--configs", default="", help="fast.sh's configurations, for rows without a number")
    args = ap.parse_args(argv)
    runs = [r for folder in args.folders for r in load_runs(folder, args.configs.split())]
    table = (wall_table(runs) if args.wall else run_table(runs) if args.runs
             else config_table(runs, args.mark, args.collapse, args.setback))
    print("\n".join(table))


if __name__ == "__main__":
    main()
