"""fasttrain experiments: `dvc exp show --json` as one narrow table. The JSON here has the shape
DVC 3 prints (a baseline per row, its experiments under it as ranges of revs); a real `dvc exp run`
and `make experiments` on the 12-variant pipeline are in tests/integration/test_pipeline.py."""

from __future__ import annotations

import pytest

from fasttrain import cli, experiments
from fasttrain.layout import VARIANTS, Layout

PATHS = Layout()


def _metrics(speed: dict[str, float], acc: float = 0.5, stale: bool = False) -> dict:
    """Every variant's train and eval metrics and compare.json over them (stale: compare.json's figures
    are another run's)."""
    files, rows = {}, {}
    for variant, ips in speed.items():
        files[str(PATHS.train_metrics(variant))] = {"data": {"train_seconds": 12.34, "images_per_second": ips}}
        files[str(PATHS.eval_metrics(variant))] = {"data": {"test_accuracy": acc}}
        rows[variant] = {"images_per_second": ips + (1 if stale else 0), "test_accuracy": acc,
                         "speedup": round(ips / speed["single-fp32"], 3), "accuracy_change": 0.0}
    files[str(PATHS.compare_json)] = {"data": {"variants": rows}}
    return files


def _entry(rev: str, params: dict, metrics: dict, name: str | None = None, timestamp: str | None = None) -> dict:
    return {"rev": rev, "name": name, "error": None,
            "data": {"rev": rev, "timestamp": timestamp, "params": {"params.yaml": {"data": params}},
                     "metrics": metrics, "deps": {}, "outs": {}, "meta": {}}}


BASE = {"train": {"lr": 0.001, "seed": 0, "epochs": 1}, "evaluate": {"batch_size": 100, "seed": 0}}
SPEED = {"single-fp32": 100.0, "single-bf16": 180.0, "ddp-amp": 150.0}


def _shown(*exps: tuple[str, dict, dict, str | None]) -> list[dict]:
    head = _entry("a" * 40, BASE, _metrics(SPEED), name="main", timestamp="2026-12-01T10:00:00")
    head["experiments"] = [{"name": name, "executor": {"state": state} if state else None,
                            "revs": [_entry(f"{i}" * 40, params, metrics, name=name, timestamp="2026-12-01T11:00:00")]}
                           for i, (name, params, metrics, state) in enumerate(exps, 1)]
    return [_entry("workspace", BASE, _metrics(SPEED)), head]


def _lines(text: str) -> list[list[str]]:
    """The table's lines (those above the first blank line) as lists of cells."""
    return [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in text.split("\n\n")[0].splitlines()]


def test_each_row_says_what_it_changed_and_the_comparisons_answer():
    lr = {**BASE, "train": {**BASE["train"], "lr": 0.005}}
    text = experiments.table(_shown(("lofty-fell", lr, _metrics({**SPEED, "ddp-amp": 250.0}), None)))
    header, workspace, main, exp = _lines(text)
    assert text.endswith(f"\n\n{experiments.LEGEND}\n") and experiments.LEGEND.startswith("base: single-fp32,")
    assert header == ["experiment", "created", "changed", "base img/s", "base acc", "fastest", "speed-up",
                      "acc change"]
    assert workspace == ["workspace", "-", "-", "100", "0.5000", "single-bf16", "1.80x", "+0.00 pp"]
    assert main == ["main", "Dec 01", "-", "100", "0.5000", "single-bf16", "1.80x", "+0.00 pp"]
    assert exp == ["└─ lofty-fell", "Dec 01", "lr=0.005", "100", "0.5000", "ddp-amp", "2.50x", "+0.00 pp"]
    assert max(map(len, text.splitlines())) <= 120


def test_a_key_whose_last_part_names_two_params_is_named_whole():
    seeds = {"train": {**BASE["train"], "seed": 3}, "evaluate": {**BASE["evaluate"], "batch_size": 50}}
    row = experiments.rows(_shown(("s", seeds, _metrics(SPEED), None)))[-1]
    assert experiments.changed(row) == "train.seed=3 batch_size=50"  # evaluate.seed exists too


def test_a_wide_table_is_cut_to_120_columns_the_changed_params_first():
    many = {"train": {**BASE["train"], **{f"knob_number_{i}": i / 7 for i in range(12)}}, "evaluate": BASE["evaluate"]}
    text = experiments.table(_shown(("an-experiment-with-a-rather-long-name-indeed", many, _metrics(SPEED), None)))
    assert max(map(len, text.splitlines())) == 120, text
    name, created, params = _lines(text)[-1][:3]
    assert params == "knob_number_0=0 knob_nu…"  # cut first, to its floor of 24
    assert name == "└─ an-experiment-with-a-rat…" and created == "Dec 01"  # then the name, to what is left


def test_a_name_that_fits_is_kept_whole_and_the_changed_params_take_what_is_left():
    many = {"train": {**BASE["train"], **{f"knob_number_{i}": i / 7 for i in range(12)}}, "evaluate": BASE["evaluate"]}
    text = experiments.table(_shown(("a-name-of-twenty-chars", many, _metrics(SPEED), None)))
    name, created, params = _lines(text)[-1][:3]
    assert name == "└─ a-name-of-twenty-chars" and params == "knob_number_0=0 knob_numbe…"
    assert max(map(len, text.splitlines())) == 120


def test_a_comparison_older_than_the_metrics_beside_it_is_marked():
    text = experiments.table(_shown(("partial", BASE, _metrics(SPEED, stale=True), None)))
    row = _lines(text)[3]
    assert row[3:] == ["101*", "0.5000*", "single-bf16*", "1.80x*", "+0.00 pp*"]
    assert text.splitlines()[-1].startswith("* metrics/compare.json is older than this experiment's train")
    assert "*" not in "".join(text.splitlines()[1:3])  # the workspace's and main's are consistent


def test_queued_and_failed_experiments_show_their_state_and_no_figures():
    text = experiments.table(_shown(("waiting", BASE, {}, "queued"), ("broke", BASE, {}, "failed")))
    queued, failed = _lines(text)[3:]
    assert queued == ["├─ waiting", "queued", "-", "-", "-", "-", "-", "-"]
    assert failed[:2] == ["└─ broke", "failed"]


def test_one_variants_figures_and_chosen_params_as_columns():
    seed = {"train": {**BASE["train"], "seed": 8}, "evaluate": BASE["evaluate"]}
    text = experiments.table(_shown(("s8", seed, _metrics(SPEED, acc=0.75), None)), "single-bf16",
                             ("train.epochs", "train.seed"))
    header, *rows = _lines(text)
    assert header == ["experiment", "created", "train.epochs", "train.seed", "train s", "images/s", "test acc"]
    assert rows[-1] == ["└─ s8", "Dec 01", "1", "8", "12.3", "180", "0.7500"]


def test_no_experiments_says_how_to_make_one():
    assert "dvc exp run -S train.lr=0.005" in experiments.table([])


@pytest.mark.parametrize("argv, fragment", [
    (["--param", "train.sed"], "no param train.sed in these experiments (did you mean 'train.seed'?)"),
    (["--variant", "single-fp64"], "Invalid value for '--variant': 'single-fp64' is not one of 'single-fp32'"),
])
def test_a_bad_choice_is_one_line(monkeypatch, capsys, argv, fragment):
    monkeypatch.setattr(experiments, "exp_show", lambda: _shown())
    with pytest.raises(SystemExit) as exit:
        cli.main(["experiments", *argv])
    out, err = capsys.readouterr()
    assert exit.value.code != 0 and out == "" and len(err.splitlines()) == 1 and fragment in err, err


def test_every_variant_is_a_choice():
    option = next(p for p in experiments.main.params if p.name == "variant")
    assert tuple(option.type.choices) == VARIANTS
