"""DVC's experiments as one narrow table: `dvc exp show` prints every param and every metric of
every file (hundreds of columns here, with names of 30-50 characters), so this reads its JSON and
prints a few columns that fit in 120 characters: what each experiment changed, and its answer."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from statistics import fmean

import click

from fasttrain.config import did_you_mean
from fasttrain.errors import FasttrainError
from fasttrain.layout import BASELINE, VARIANTS, Layout

WIDTH = 120
# When a table is wider than WIDTH, these columns are cut (with "…") in turn, each down to its floor: the
# changed params first to a readable width, then the name, then the changed params to their header's width.
SHRINKS = (("changed", 24), ("experiment", 16), ("changed", 0))
LEGEND = (f"base: {BASELINE}, what the others are compared with; speed-up and acc change (points): the fastest "
          "variant's against it")
STALE = ("* metrics/compare.json is older than this experiment's train or evaluate metrics (it ran without the "
         "compare stage)")
PATHS = Layout()


def _seeds(params: dict) -> list[int]:
    seeds = params.get("compare.seeds")
    return seeds if isinstance(seeds, list) and seeds else [0]


def _mean(files: list[dict], key: str):
    """The figure's mean over the seeds' files that have it (None where none does)."""
    values = [f[key] for f in files if isinstance(f.get(key), (int, float))]
    return fmean(values) if values else None


def exp_show() -> list[dict]:
    """`dvc exp show --json` of the repository here: its baselines (the workspace and HEAD), each
    with its experiments."""
    done = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise FasttrainError(f"dvc exp show failed: {last.removeprefix('ERROR: ')}")
    try:
        return json.loads(done.stdout or "[]")
    except json.JSONDecodeError as e:
        raise FasttrainError(f"dvc exp show --json printed no JSON: {e}") from None


def rows(shown: list[dict]) -> list[dict]:
    """One row per baseline and experiment, in `dvc exp show`'s order: its name (experiments indented
    under their baseline), when it was made or its queue state, its params and metrics (by file), and
    the params of the baseline it is compared with (an experiment's: its own baseline's; the workspace's:
    HEAD's)."""
    out = []
    head = next((b for b in shown if b.get("rev") != "workspace"), None)
    for baseline in shown:
        own = _params(baseline)
        if baseline.get("rev") == "workspace":
            out.append(_row(baseline, "workspace", _params(head) if head else own))
            continue
        out.append(_row(baseline, baseline.get("name") or baseline["rev"][:7], own))
        ranges = baseline.get("experiments") or []
        for i, exp in enumerate(ranges):
            last = (exp.get("revs") or [{}])[0]
            name = exp.get("name") or last.get("name") or last.get("rev", "")[:7]
            state = (exp.get("executor") or {}).get("state")
            out.append(_row(last, ("└─ " if i == len(ranges) - 1 else "├─ ") + name, own,
                            None if state in (None, "success") else state))
    return out


def _row(entry: dict, name: str, base_params: dict, state: str | None = None) -> dict:
    data = entry.get("data") or {}
    return {"experiment": name, "created": state or ("error" if entry.get("error") else _when(data.get("timestamp"))),
            "params": _params(entry), "base_params": base_params,
            "metrics": {path: (m or {}).get("data") or {} for path, m in (data.get("metrics") or {}).items()}}


def _params(entry: dict | None) -> dict:
    flat = {}
    for file in ((entry or {}).get("data") or {}).get("params", {}).values():
        _flatten((file or {}).get("data") or {}, "", flat)
    return flat


def _flatten(tree, prefix: str, into: dict) -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            _flatten(v, f"{prefix}{k}.", into)
    else:
        into[prefix.rstrip(".")] = tree


def _when(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    made = datetime.fromisoformat(timestamp)
    return made.strftime("%H:%M" if made.date() == datetime.now().date() else "%b %d")


def changed(row: dict) -> str:
    """The params that differ from the baseline's, `key=value`, a key by its last part where that
    part names one param."""
    mine, base = row["params"], row["base_params"]
    keys = [k for k in {**base, **mine} if mine.get(k) != base.get(k)]
    ends = [k.rsplit(".", 1)[-1] for k in {**base, **mine}]
    short = {k: k.rsplit(".", 1)[-1] if ends.count(k.rsplit(".", 1)[-1]) == 1 else k for k in keys}
    return " ".join(f"{short[k]}={_value(mine.get(k))}" for k in keys) or "-"


def _value(v) -> str:
    return "(none)" if v is None else json.dumps(v) if isinstance(v, (list, dict, bool)) else f"{v:g}" \
        if isinstance(v, float) else str(v)


def _figures(metrics: dict, variant: str | None, seeds: list[int]) -> dict:
    """The figures a row shows: one variant's (train and evaluate metrics), or else the comparison's
    answer (metrics/compare.json): single-fp32's rate and accuracy, the fastest variant, its speed-up
    and accuracy change, each marked `*` where the comparison's figures are not those of the train and
    evaluate metrics beside it (the experiment ran without the compare stage). Over several seeds
    (compare.seeds), a variant's figures are their means."""
    def files(kind: str, v: str) -> list[dict]:
        return [metrics.get(str(getattr(PATHS.for_seed(seed), kind)(v)), {}) for seed in seeds]

    if variant:
        train, ev = files("train_metrics", variant), files("eval_metrics", variant)
        return {"train s": _num(_mean(train, "train_seconds"), "{:.1f}"),
                "images/s": _num(_mean(train, "images_per_second"), "{:,.0f}"),
                "test acc": _num(_mean(ev, "test_accuracy"), "{:.4f}")}
    table = metrics.get(str(PATHS.compare_json), {}).get("variants") or {}
    base = table.get(BASELINE, {})
    fastest = max((v for v in table if "speedup" in table[v]), key=lambda v: table[v]["speedup"], default=None)
    best = table.get(fastest, {})
    def moved(mean, figure) -> bool:  # compare.json rounds a mean over seeds to its figure's digits
        return mean is not None and (figure is None or abs(mean - figure) > 1e-4 * max(1.0, abs(figure)))

    stale = any(moved(_mean(files("train_metrics", v), "images_per_second"), r.get("images_per_second"))
                or moved(_mean(files("eval_metrics", v), "test_accuracy"), r.get("test_accuracy"))
                for v, r in table.items())
    mark = "*" if stale else ""
    return {"base img/s": _num(base.get("images_per_second"), "{:,.0f}") + mark,
            "base acc": _num(base.get("test_accuracy"), "{:.4f}") + mark,
            "fastest": (fastest or "-") + mark, "speed-up": _num(best.get("speedup"), "{:.2f}x") + mark,
            "acc change": _num(best.get("accuracy_change"), "{:+.2f} pp") + mark}


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def table(shown: list[dict], variant: str | None = None, params: tuple[str, ...] = (), width: int = WIDTH) -> str:
    """The experiments as aligned text at most `width` characters wide (the experiment names and the
    changed params cut to fit), with the comparison's legend under it and a note where a row's
    comparison is stale. `params`: these params' values as columns, instead of what each row changed."""
    body = []
    for row in rows(shown):
        named = {k: _value(row["params"].get(k)) for k in params} if params else {"changed": changed(row)}
        body.append({"experiment": row["experiment"], "created": row["created"], **named,
                     **_figures(row["metrics"], variant, _seeds(row["params"]))})
    if not body:
        return "no experiments: run one with dvc exp run (e.g. dvc exp run -S train.lr=0.005)\n"
    headers = list(body[0])
    widths = {h: max(len(h), *(len(r[h]) for r in body)) for h in headers}
    for column, floor in ((c, f) for c, f in SHRINKS if c in widths):
        over = sum(widths.values()) + 2 * (len(widths) - 1) - width
        if over > 0:
            widths[column] = max(len(column), min(floor, widths[column]), widths[column] - over)
    right = set(headers) - {"experiment", "created", "changed", "fastest"} - set(params)

    def line(cells: dict) -> str:
        return "  ".join(_fit(cells[h], widths[h], h in right) for h in headers).rstrip()

    lines = [line({h: h for h in headers}), *map(line, body)]
    if not variant:
        lines += ["", LEGEND] + [STALE] * any(r["speed-up"].endswith("*") for r in body)
    return "\n".join(lines) + "\n"


def _fit(text: str, width: int, right: bool) -> str:
    text = text if len(text) <= width else text[:width - 1] + "…"
    return text.rjust(width) if right else text.ljust(width)


@click.command("experiments")
@click.option("--variant", type=click.Choice(VARIANTS), default=None,
              help="Show this variant's train seconds, images/s and test accuracy instead of the comparison.")
@click.option("--param", "params", multiple=True, metavar="KEY",
              help="Show this param's value (e.g. train.seed) instead of what each changed; repeatable.")
def main(variant: str | None, params: tuple[str, ...]) -> None:
    """The workspace, HEAD and HEAD's DVC experiments, one row each: what each changed against its
    baseline and its figures (dvc exp show --json), in 120 columns."""
    shown = exp_show()
    known = set().union(*(r["params"] for r in rows(shown)))
    unknown = [k for k in params if known and k not in known]
    if unknown:
        raise FasttrainError(f"no param {unknown[0]} in these experiments{did_you_mean(unknown[0], known)}; "
                             "a param is a params.yaml key by its sections, e.g. train.seed")
    click.echo(table(shown, variant, params), nl=False)
