"""PNG pictures for the README from a finished pipeline run: `python scripts/readme_pictures.py WORKSPACE OUTDIR
[--plot NAME ...] [--partial] [--scale N]`.

WORKSPACE is a folder where `dvc repro` has run (dvc.yaml, .dvc/plots/, plots/, metrics/), e.g. `.demo` after
`make demo`. The specs are the ones `dvc plots show` puts on its page, taken from `dvc plots show --json` (DVC fills
the dvc.yaml `plots:` definitions and templates, .dvc/plots/variants.json included, with the data), and drawn by
vl-convert (`pip install -e '.[docs]'`), which renders Vega-Lite without a browser or the network. By default every
plot of the top-level `plots:` section of dvc.yaml is drawn; `--plot` picks plot ids (or a stage's plot file, e.g.
plots/train/single-bf16.csv). Writes OUTDIR/<plot id>.png, each through a temporary file and a rename, and only
after every picture has rendered; prints the paths.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from fasttrain import atomic
from fasttrain.atomic import DiskError


class Fail(Exception):
    """A one-line reason to stop."""


def top_level_plot_ids(workspace: Path) -> list[str]:
    """The ids of dvc.yaml's top-level `plots:` section, in order (a bare entry is a file path, its own id)."""
    dvc_yaml = workspace / "dvc.yaml"
    if not dvc_yaml.is_file():
        raise Fail(f"{workspace} has no dvc.yaml: not a pipeline workspace")
    entries = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("plots") or []
    ids = []
    for entry in entries:
        ids.extend(entry if isinstance(entry, dict) else [entry])
    if not ids:
        raise Fail(f"{dvc_yaml} defines no top-level plots")
    return [str(i) for i in ids]


def find_dvc() -> str:
    """The dvc next to this Python (the project's venv) first, then whichever is on PATH."""
    beside = Path(sys.executable).parent / "dvc"
    found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("dvc")
    if not found:
        raise Fail("dvc not found (neither beside this Python nor on PATH): run `make setup` and use .venv/bin/python")
    return found


def vega_lite_specs(workspace: Path, names: list[str], partial: bool = False) -> dict[str, dict]:
    """{plot id: the filled Vega-Lite spec} from `dvc plots show --json`, run in the workspace.
    partial: draw what a stopped run made (says on stderr which files are missing) instead of failing."""
    with tempfile.TemporaryDirectory() as out:  # where DVC would put image plots; none are used here
        proc = subprocess.run([find_dvc(), "plots", "show", "--json", "-o", out, *names], cwd=workspace,
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise Fail(f"`dvc plots show --json` failed in {workspace} (exit {proc.returncode}): {last}")
    try:
        shown = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise Fail(f"`dvc plots show --json` printed no JSON ({e})") from None

    # A missing or unreadable file: the chart would silently lack those variants, which is no README picture.
    errors = [e for e in shown.get("errors", []) if e.get("name") in (None, *names)]
    missing = sorted({e["source"] for e in errors if e.get("type") == "FileNotFoundError" and e.get("source")})
    if missing and partial:
        print(f"readme_pictures: {len(missing)} plot file(s) missing, drawn without them: {', '.join(missing)}",
              file=sys.stderr)
        errors = [e for e in errors if e.get("type") != "FileNotFoundError"]
    elif missing:
        raise Fail(f"{len(missing)} plot file(s) missing in {workspace}, e.g. {missing[0]}: has `dvc repro` finished?")
    if errors:
        e = errors[0]
        raise Fail(f"DVC could not load plot {e.get('name', '?')} in {workspace} ({len(errors)} error(s)), first: "
                   f"{e.get('source', e.get('rev', ''))}: {e.get('type', '')}: {e.get('msg', '')}")

    specs = {}
    data = shown.get("data", {})
    for name in names:
        vega = [p for p in data.get(name, []) if p.get("type") == "vega"]
        if not vega:
            raise Fail(f"no data for plot {name!r} in {workspace} (no such plot, or `dvc repro` has not made it); "
                       f"top-level plots: {', '.join(top_level_plot_ids(workspace))}")
        content = vega[0]["content"]
        specs[name] = json.loads(content) if isinstance(content, str) else content
    return specs


def render_png(spec: dict, scale: float = 2) -> bytes:
    try:
        import vl_convert
    except ImportError:
        raise Fail("vl-convert-python is not installed: pip install -e '.[docs]'") from None
    png = vl_convert.vegalite_to_png(json.dumps(spec), scale=scale)
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise Fail("vl-convert returned something that is not a PNG")
    return png


def file_name(plot_id: str) -> str:
    """A plot id as a file name: plots/train/single-bf16.csv -> plots_train_single-bf16_csv (DVC's page ids)."""
    return re.sub(r"[^\w-]+", "_", plot_id).strip("_") + ".png"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path, help="a folder where `dvc repro` has run, e.g. .demo")
    parser.add_argument("outdir", type=Path, help="where the PNGs go (made if missing)")
    parser.add_argument("--plot", action="append", metavar="NAME",
                        help="a plot id of dvc.yaml (repeatable); default: every top-level plot")
    parser.add_argument("--partial", action="store_true",
                        help="draw a stopped run's plots without the files it did not make (default: an error)")
    parser.add_argument("--scale", type=float, default=2, help="pixels per Vega-Lite unit (default 2)")
    args = parser.parse_args(argv)
    try:
        workspace = args.workspace.resolve()
        if not workspace.is_dir():
            raise Fail(f"{args.workspace} is not a folder")
        names = args.plot or top_level_plot_ids(workspace)
        specs = vega_lite_specs(workspace, names, args.partial)
        pictures = {name: render_png(spec, args.scale) for name, spec in specs.items()}  # all, before writing any
        args.outdir.mkdir(parents=True, exist_ok=True)
        for name, png in pictures.items():
            path = args.outdir / file_name(name)
            atomic.atomic_write_bytes(path, png, "a picture")  # the old picture or the new one, whole
            print(path)
    except (Fail, DiskError) as e:
        print(f"readme_pictures: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
