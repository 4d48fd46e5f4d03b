#!/usr/bin/env python3
"""What a user waits for, and for what: run a pipeline command (`dvc repro`, `make fast SEED=3`) and
print, per stage, DVC's wall for it, the fasttrain process's own seconds (its diagnostics'
`process_seconds`), the training work in them (epochs and their test-set evaluation; an evaluate
stage's evaluation), the process's fixed cost (the rest) and the time around the process (DVC, the
ddp launcher, the process's start before Python and its exit).

    python scripts/time_to_answer.py [--out docs/results/x.md] -- dvc repro
    python scripts/time_to_answer.py -- make fast SEED=3

Stages are told apart by DVC's "Running stage" lines; each lasts until the next one or the command's
end. Their diagnostics are read from the workspace, or, after `dvc exp run --temp` (make fast), from
DVC's cache, by the hash the newest experiment recorded (`dvc exp show --json`). Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

RUNNING = re.compile(r"Running stage '([^']+)'")


def run_timed(command: list[str]) -> tuple[float, list[tuple[str, float]], int]:
    """Runs `command`, echoing its output; (wall, [(stage, seconds since the start)], exit status)."""
    start = time.perf_counter()
    stages = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in proc.stdout:
        sys.stdout.write(line)
        m = RUNNING.search(line)
        if m:
            stages.append((m.group(1), time.perf_counter() - start))
    status = proc.wait()
    return time.perf_counter() - start, stages, status


def diagnostics_path(stage: str) -> Path | None:
    """A train or evaluate stage's diagnostics: train@single-fp32-0 -> diagnostics/train/seed0/single-fp32.json."""
    kind, _, item = stage.partition("@")
    variant, _, seed = item.rpartition("-")
    if not variant or kind not in ("train", "evaluate"):
        return None
    return Path("diagnostics") / {"train": "train", "evaluate": "eval"}[kind] / f"seed{seed}" / f"{variant}.json"


def _newest_experiment_outputs() -> dict[str, Path]:
    """path -> the file in DVC's cache of each output of the newest experiment (dvc exp show --json)."""
    out = subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True, check=False).stdout
    cache = subprocess.run(["dvc", "cache", "dir"], capture_output=True, text=True, check=False).stdout.strip()
    best: tuple[str, dict] = ("", {})

    def visit(node):
        nonlocal best
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, dict) and data.get("outs") and (data.get("timestamp") or "") > best[0]:
                best = (data.get("timestamp") or "", data["outs"])
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    try:
        visit(json.loads(out or "[]"))
    except json.JSONDecodeError:
        return {}
    # DVC 3's cache layout: files/md5/<first two hex digits>/<the rest>
    return {path: Path(cache or ".dvc/cache") / "files" / "md5" / entry["hash"][:2] / entry["hash"][2:]
            for path, entry in best[1].items() if isinstance(entry, dict) and entry.get("hash")}


def stage_rows(wall: float, stages: list[tuple[str, float]], started: float) -> list[dict]:
    experiment = None
    rows = []
    for i, (stage, at) in enumerate(stages):
        end = stages[i + 1][1] if i + 1 < len(stages) else wall
        row = {"stage": stage, "wall": end - at, "process": None, "work": None}
        path = diagnostics_path(stage)
        if path and not (path.is_file() and path.stat().st_mtime >= started):
            experiment = _newest_experiment_outputs() if experiment is None else experiment
            path = experiment.get(path.as_posix())
        try:
            record = json.loads(path.read_text()) if path else None
        except (OSError, json.JSONDecodeError):
            record = None
        phases = (record or {}).get("process_seconds")
        if isinstance(phases, dict) and "total" in phases:
            row["process"] = phases["total"]
            row["work"] = phases.get("train", 0.0) + phases.get("eval", 0.0)
            row["phases"] = phases
        rows.append(row)
    return rows


def _f(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def table(command: list[str], wall: float, rows: list[dict], status: int) -> str:
    measured = [r for r in rows if r["process"] is not None]
    process = sum(r["process"] for r in measured)
    work = sum(r["work"] for r in measured)
    lines = [
        f"`{' '.join(command)}`: {wall:.1f} s wall (exit {status}), {len(rows)} stage(s) run; "
        f"training work {work:.1f} s, fasttrain processes {process:.1f} s, "
        f"outside them {wall - process:.1f} s (DVC, launchers, process start and exit).",
        "",
        "| stage | wall s | process s | work s | fixed s (process - work) | around s (wall - process) | start_up s | prepare s | warm_up s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r.get("phases", {})
        fixed = None if r["process"] is None else r["process"] - r["work"]
        around = None if r["process"] is None else r["wall"] - r["process"]
        lines.append(f"| {r['stage']} | {_f(r['wall'])} | {_f(r['process'])} | {_f(r['work'])} | {_f(fixed)} | "
                     f"{_f(around)} | {_f(p.get('start_up'))} | {_f(p.get('prepare'))} | {_f(p.get('warm_up'))} |")
    before = rows[0]["wall"] if rows else wall
    lines += ["", f"Before the first stage (DVC's start, the pipeline read, deps checked): "
              f"{(wall - sum(r['wall'] for r in rows)) if rows else before:.1f} s."]
    return "\n".join(lines)


def host() -> str:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False).stdout.strip() if _has("nvidia-smi") else ""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    flags = [f"{k}={os.environ[k]}" for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX",
                                             "FASTTRAIN_BYTECODE_CACHE", "TORCHINDUCTOR_CACHE_DIR") if k in os.environ]
    return (f"{platform.node()}: {gpu or 'no GPU'}; {os.cpu_count()} x {cpu}; Python {platform.python_version()}"
            f"{'; ' + ', '.join(flags) if flags else ''}")


def _has(program: str) -> bool:
    return any((Path(d) / program).is_file() for d in os.environ.get("PATH", "").split(os.pathsep))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also append the table, with the host and date, to this markdown file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. -- dvc repro")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give one after --, e.g. -- dvc repro")
    started = time.time()
    wall, stages, status = run_timed(command)
    text = table(command, wall, stage_rows(wall, stages, started), status)
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {host()}\n\n{text}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
