"""The product end to end: the real `dvc repro` of all 12 variants in a scratch copy of the repo."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from scratch import REPO, TINY, record, run, set_params, stages_run
from stage_imports import PACKAGE, command_modules, module_file, package_modules
from test_plots_browser import assert_draws_offline

from fasttrain.evaluate import HEADLINE as EVAL_HEADLINE
from fasttrain.layout import VARIANTS
from fasttrain.report import HEADLINE as TRAIN_HEADLINE

pytestmark = pytest.mark.slow


def make_demo(repo: Path) -> Path:
    """`make demo` of `repo`, with TINY as its demo/params.yaml over the repository's own params.yaml
    and this Python's environment as the one it links to: the scratch git repository it made."""
    (repo / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (repo / "demo" / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    venv = sys.prefix  # (-o: taken as set up, so no test ever builds an environment)
    first = run(["make", f"VENV={venv}", "-o", f"{venv}/.installed", "demo"], repo, timeout=1800)
    assert len(stages_run(first.stdout)) == 1 + 12 + 12 + 1
    demo = repo / ".demo"
    assert (demo / ".venv").resolve() == Path(venv).resolve()
    assert run(["git", "status", "--porcelain"], demo).stdout == ""  # the run committed
    assert len(run(["git", "log", "--format=%s"], demo).stdout.splitlines()) == 2
    for line in (REPO / "params.yaml").read_text().splitlines():  # every comment kept, each where it was
        assert "#" not in line or line[line.index("#"):] in (demo / "params.yaml").read_text(), line
    return demo


def test_make_demo_trains_evaluates_and_compares_all_variants_and_its_sequence_works(tiny_repo, tmp_path):
    demo = make_demo(tiny_repo)

    for variant in VARIANTS:
        for stage, headline in (("train", TRAIN_HEADLINE), ("eval", EVAL_HEADLINE)):  # the rest: diagnostics
            assert list(json.loads((demo / "metrics" / stage / "seed0" / f"{variant}.json").read_text())) == list(headline)
        train = record(demo, variant)
        assert train["variant"] == variant and train["epochs"] == 1
        assert train["peak_memory_mb"] > 0
        # one epoch of all 128 training images, over every rank: the rate times the epoch's seconds
        assert train["images_per_second"] * train["epoch_seconds"] == pytest.approx(128, rel=2e-2)
        assert train["torch_version"] and train["device"] == "CPU"
        assert train["world_size"] == (2 if variant.startswith("ddp") else 1)
        if variant.startswith("dp-"):
            assert any("DataParallel" in w for w in train["warnings"])
        ev = record(demo, variant, "evaluate")
        assert ev["test_images"] == 50 and 0 <= ev["test_accuracy"] <= 1
        assert sum(map(sum, ev["confusion_matrix"])) == 50
        confusion_rows = (demo / "plots" / "confusion" / "seed0" / f"{variant}.csv").read_text().splitlines()
        assert len(confusion_rows) == 1 + 50
        model = (demo / "models" / "seed0" / f"{variant}.pt").stat()
        # on disk once: the workspace's model is the file in DVC's cache (.dvc/config, cache.type), read-only
        assert model.st_nlink == 2 and not model.st_mode & 0o222, oct(model.st_mode)
        assert list((demo / "tensorboard" / "seed0" / variant).glob("events.out.tfevents.*"))

    # each row against its own train and eval metrics files (the arithmetic by hand: test_compare)
    table = json.loads((demo / "metrics" / "compare.json").read_text())
    assert list(table["variants"]) == list(VARIANTS)
    files = {v: (json.loads((demo / "metrics" / "train" / "seed0" / f"{v}.json").read_text()),
                 json.loads((demo / "metrics" / "eval" / "seed0" / f"{v}.json").read_text())) for v in VARIANTS}
    base_train, base_eval = files["single-fp32"]
    for variant, row in table["variants"].items():
        train, ev = files[variant]
        assert (row["images_per_second"], row["test_accuracy"]) == (train["images_per_second"], ev["test_accuracy"])
        assert row["speedup"] == pytest.approx(train["images_per_second"] / base_train["images_per_second"], abs=1e-3)
        assert row["accuracy_change"] == pytest.approx(100 * (ev["test_accuracy"] - base_eval["test_accuracy"]),
                                                       abs=1e-2)
    markdown = (demo / "metrics" / "compare.md").read_text()
    assert all(f"| {v} |" in markdown for v in VARIANTS)
    assert "speed-up (CPU)" in markdown and "| peak process memory (RSS) MB |" in markdown
    notes = [line for line in markdown.splitlines() if line.startswith("- ")]
    assert len(notes) == len(set(notes)) and "- train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU): " \
        "every variant" in notes, notes  # each warning once

    # every headline figure of the 24 files in one table a 200-column terminal shows whole
    shown = run(["make", "-s", "metrics"], demo).stdout.splitlines()
    rows = [line for line in shown if line.startswith("| metrics/")]
    assert len(rows) == 2 * len(VARIANTS) and max(map(len, shown)) <= 200, "\n".join(shown)
    assert set(TRAIN_HEADLINE) | set(EVAL_HEADLINE) <= {c.strip() for c in shown[0].split("|")}, shown[0]

    # The plots page of this run, in a real browser with the network unplugged (docs/img/plots-offline.png
    # is this page of make demo)
    run(["dvc", "plots", "show", "-o", str(tmp_path / "show")], demo)
    assert_draws_offline(tmp_path / "show" / "index.html", tmp_path, 4 + 4 + 2 * len(VARIANTS))

    second = run(["dvc", "repro"], demo)
    assert stages_run(second.stdout) == [], second.stdout
    assert_each_module_edit_makes_its_stages_stale(demo)

    # Changing train.lr makes every train stage stale and never download (DVC's own account;
    # test_params_keys.py checks every key this way). One of them run again makes its evaluate stage
    # and compare stale through the files it rewrote: what dvc.yaml's deps say, without 25 more runs.
    def stale():
        return sorted(json.loads(run(["dvc", "status", "--json"], demo).stdout))

    # the run section changes no result: no stage is stale, and the next runs take the new values
    params = (demo / "params.yaml").read_text()
    set_params(demo, {"run": {"log_every_steps": 7, "checkpoint_every": 3, "max_restarts": 2}})
    assert stale() == []
    (demo / "params.yaml").write_text(params)

    # The README's sequence in .demo/, as a user types it: train.lr edited in params.yaml, then
    # `make train-ddp-amp` (this environment, .demo's code), `make repro`, `dvc metrics diff`.
    edited = re.sub(r"(?m)^  lr: 0\.001 ", "  lr: 0.005 ", params)
    assert edited != params
    (demo / "params.yaml").write_text(edited)
    assert stale() == sorted(f"train@{v}-0" for v in VARIANTS)
    show = ["make", "-s", "--eval", "where: ; @python -c 'import fasttrain; print(fasttrain.__file__)'", "where"]
    assert run(show, demo).stdout.strip() == str(demo / "src" / "fasttrain" / "__init__.py")
    one = run(["make", "train-ddp-amp"], demo, timeout=1800)  # no -o: the linked environment counts as set up
    assert stages_run(one.stdout) == ["train@ddp-amp-0"], one.stdout
    assert (demo / ".venv").is_symlink() and "pip" not in one.stdout + one.stderr
    rest = run(["make", "repro"], demo, timeout=1800)
    assert stages_run(rest.stdout) == sorted(["compare", *(f"evaluate@{v}-0" for v in VARIANTS),
                                              *(f"train@{v}-0" for v in VARIANTS if v != "ddp-amp")]), rest.stdout

    diff = json.loads(run(["dvc", "metrics", "diff", "--json"], demo).stdout)
    for variant in VARIANTS:  # every variant trained again with the new lr
        changed = diff[f"metrics/train/seed0/{variant}.json"]
        assert changed["train_loss"]["diff"] != 0
        assert set(changed) <= set(TRAIN_HEADLINE), changed  # headline figures only: no phases, no lists
    speedups = {k for k in diff["metrics/compare.json"] if k.endswith(".speedup")}
    assert speedups and speedups <= {f"variants.{v}.speedup" for v in VARIANTS if v != "single-fp32"}, diff
    assert yaml.safe_load((demo / "params.yaml").read_text())["train"]["lr"] == 5e-3

    # the same change as a DVC experiment (every stage restored from the run cache), then the one
    # command that shows the experiments in 120 columns: what each changed, and compare's answer
    run(["dvc", "exp", "run", "-S", "train.lr=0.005"], demo, timeout=1800)
    shown = run(["make", "-s", "experiments"], demo).stdout
    lines = shown.splitlines()
    assert max(map(len, lines)) <= 120, shown
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[:lines.index("")]]
    assert cells[0] == ["experiment", "created", "changed", "base img/s", "base acc", "fastest", "speed-up",
                        "acc change"], shown
    exp = next(row for row in cells if row[0].startswith(("├─ ", "└─ ")))
    rows = json.loads((demo / "metrics" / "compare.json").read_text())["variants"]
    fastest = max(rows, key=lambda v: rows[v]["speedup"])
    assert exp[2:] == ["lr=0.005", f"{rows['single-fp32']['images_per_second']:,.0f}",
                       f"{rows['single-fp32']['test_accuracy']:.4f}", fastest, f"{rows[fastest]['speedup']:.2f}x",
                       f"{rows[fastest]['accuracy_change']:+.2f} pp"], shown


def assert_each_module_edit_makes_its_stages_stale(repo):
    """A one-line change to any module of src/fasttrain makes exactly the stages that run it stale
    (their import closure, tests/stage_imports.py), and nothing else: DVC's own status, asked in this
    process, one module at a time."""
    from dvc.repo import Repo

    stages = {"download": ["download"], "compare": ["compare"],
              "train": [f"train@{v}-0" for v in VARIANTS], "evaluate": [f"evaluate@{v}-0" for v in VARIANTS]}
    runs = {command: command_modules(command) for command in stages}
    for module in package_modules():
        path = repo / module_file(module).relative_to(PACKAGE.parents[1])
        original = path.read_bytes()
        path.write_bytes(original + b"# edited\n")
        try:
            with Repo(str(repo)) as dvc:
                stale = sorted(name.split("dvc.yaml:")[-1] for name in dvc.status())  # (path-qualified outside cwd)
        finally:
            path.write_bytes(original)
        expected = sorted(s for command, names in stages.items() if module in runs[command] for s in names)
        assert stale == expected, f"an edit to {path.name} made {stale} stale, not {expected}"
    with Repo(str(repo)) as dvc:
        assert dvc.status() == {}


# resnet18 learns the stripes' orientation from 1,024 images in one epoch: 0.27-0.63 test accuracy
# over data and training seeds 0-8 (0.50 at seed 0), against 0.10 by chance.
LEARNS = {"data": {"synthetic_train_size": 1024, "synthetic_test_size": 100},
          "model": {"name": "resnet18"}, "train": {"lr": 2e-3, "device": "cpu"}, "evaluate": {"batch_size": 100}}


def test_single_fp32_learns_the_synthetic_set(tiny_repo):
    set_params(tiny_repo, LEARNS)
    for command in (["download"], ["train", "--parallel", "single", "--precision", "fp32"],
                    ["evaluate", "--parallel", "single", "--precision", "fp32"]):
        run(["fasttrain", *command], tiny_repo)
    ev = json.loads((tiny_repo / "metrics" / "eval" / "seed0" / "single-fp32.json").read_text())
    assert ev["test_images"] == 100 and ev["test_accuracy"] >= 0.2  # twice chance
