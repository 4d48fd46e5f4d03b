"""scripts/overlay.py, as make demo, make fast and the GPU scripts call it: a real process each time."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "overlay.py"
BASE = {"data": {"source": "cifar10", "augment": False}, "train": {"epochs": 20, "lr": 1e-4, "compile": False}}


def overlay(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE, sort_keys=False))
    (tmp_path / "recipe.yaml").write_text("train:\n  epochs: 3\n  compile: true\ndata:\n  augment: true\n")
    return tmp_path


def test_the_overlay_then_each_override_replaces_single_keys_and_keeps_the_rest(files):
    proc = overlay("base.yaml", "recipe.yaml", "out.yaml", "train.lr=7.0e-4", "train.seed=3", "data.source=/a b.tgz",
                   cwd=files)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = yaml.safe_load((files / "out.yaml").read_text())
    assert out == {"data": {"source": "/a b.tgz", "augment": True},
                   "train": {"epochs": 3, "lr": 7e-4, "compile": True, "seed": 3}}  # values parsed as YAML
    assert list(out) == ["data", "train"] and list(out["train"])[:3] == ["epochs", "lr", "compile"]  # BASE's order


def test_an_empty_overlay_and_out_over_base_in_place(files):
    proc = overlay("base.yaml", "/dev/null", "base.yaml", "train.epochs=2", cwd=files)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((files / "base.yaml").read_text())["train"] == {"epochs": 2, "lr": 1e-4, "compile": False}
    assert sorted(p.name for p in files.iterdir()) == ["base.yaml", "recipe.yaml"]  # no temporary file left


def test_dvc_flags_give_every_key_of_the_overlay_as_dvc_exp_run_sets(files):
    proc = overlay("--dvc-flags", "recipe.yaml", cwd=files)
    assert proc.returncode == 0
    assert proc.stdout.split() == ["-S", "train.epochs=3", "-S", "train.compile=True", "-S", "data.augment=True"]


def test_help_prints_both_forms():
    proc = overlay("--help", cwd=SCRIPT.parent)
    assert proc.returncode == 0 and "overlay.py BASE OVERLAY OUT" in proc.stdout and "--dvc-flags" in proc.stdout


@pytest.mark.parametrize("args, message", [
    ([], "usage: overlay.py BASE OVERLAY OUT [section.key=value ...] |"),
    (["base.yaml", "recipe.yaml"], "usage: overlay.py BASE OVERLAY OUT"),
    (["--dvc-flags"], "usage: overlay.py BASE OVERLAY OUT"),
    (["base.yaml", "missing.yaml", "out.yaml"], "cannot read missing.yaml: No such file or directory"),
    (["base.yaml", "broken.yaml", "out.yaml"], "broken.yaml is not YAML: "),
    (["base.yaml", "list.yaml", "out.yaml"], "list.yaml is not sections of keys (section: {key: value})"),
    (["base.yaml", "recipe.yaml", "out.yaml", "train.lr"], "bad override 'train.lr': use section.key=value"),
    (["base.yaml", "recipe.yaml", "out.yaml", "lr=1"], "bad override 'lr=1': use section.key=value"),
    (["base.yaml", "recipe.yaml", "out.yaml", "train.lr=[1"], "bad override 'train.lr=[1': its value is not YAML"),
    (["base.yaml", "recipe.yaml", "out.yaml", "trian.lr=1"],
     "no section 'trian' in base.yaml (its sections: data, train)"),
    (["base.yaml", "recipe.yaml", "nowhere/out.yaml"], "cannot write nowhere/out.yaml: No such file or directory"),
])
def test_bad_input_is_one_line_exit_2_and_no_output(files, args, message):
    (files / "broken.yaml").write_text("train: {epochs: 3\n")
    (files / "list.yaml").write_text("- train\n")
    (files / "out.yaml").write_text("before\n")
    before = {p.name: p.read_bytes() for p in files.iterdir()}
    proc = overlay(*args, cwd=files)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("overlay.py: error: "), proc.stderr
    assert message in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in files.iterdir()} == before  # OUT untouched, nothing left behind


COMMENTED = """\
# the header
data:                    # the data section
  source: cifar10        # where the images come from
  augment: false
train:
  epochs: 20             # passes over the set
                         # (a comment's second line)
  lr: 1.0e-4             # the peak lr

evaluate:
  batch_size: 500
"""


def test_out_is_bases_text_with_its_comments_and_the_keys_laid_over_named_first(tmp_path):
    (tmp_path / "base.yaml").write_text(COMMENTED)
    (tmp_path / "demo.yaml").write_text("train:\n  lr: 0.01  # the demo's own comment\n  seed: 3\ndata:\n  source: synthetic\n")
    proc = overlay("base.yaml", "demo.yaml", "out.yaml", "evaluate.batch_size=50", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = (tmp_path / "out.yaml").read_text()
    assert out == (
        "# base.yaml with demo.yaml and the command line's values laid over it: train.lr, train.seed,\n"
        "# data.source, evaluate.batch_size\n"
        + COMMENTED.replace("  source: cifar10        #", "  source: synthetic      #")
        .replace("  lr: 1.0e-4             # the peak lr\n", "  lr: 0.01               # the peak lr\n  seed: 3\n")
        .replace("batch_size: 500", "batch_size: 50"))
    assert yaml.safe_load(out)["train"] == {"epochs": 20, "lr": 0.01, "seed": 3}


def test_a_base_in_flow_style_is_written_plainly_and_says_it_lost_its_comments(tmp_path):
    (tmp_path / "base.yaml").write_text("train: {lr: 1, epochs: 2}  # flow\n")
    proc = overlay("base.yaml", "/dev/null", "out.yaml", "train.lr=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "overlay.py: base.yaml's layout is not one key per line under its section: written " \
                          "without its comments\n"
    assert yaml.safe_load((tmp_path / "out.yaml").read_text()) == {"train": {"lr": 3, "epochs": 2}}
