"""`make train-<parallel>-<precision>` as Make and DVC users expect it, through the real make and dvc in
a scratch copy of the repo: nothing changed, nothing runs; FORCE=1 trains the variant again."""

import re

import pytest

from scratch import run, set_params, stages_run

pytestmark = pytest.mark.slow


def make(repo, *args):
    # -o: take this Python's environment as set up, so the scratch copy never builds a .venv of its own
    return run(["make", "-o", ".venv/.installed", *args], repo, timeout=600)


def test_train_target_runs_only_when_something_changed_and_force_trains_again(tiny_repo):
    first = make(tiny_repo, "train-single-fp32")
    assert stages_run(first.stdout) == ["download", "train@single-fp32-0"], first.stdout

    again = make(tiny_repo, "train-single-fp32")
    assert stages_run(again.stdout) == [], again.stdout

    forced = make(tiny_repo, "train-single-fp32", "FORCE=1")
    assert stages_run(forced.stdout) == ["train@single-fp32-0"], forced.stdout  # the data set is kept

    set_params(tiny_repo, {"train": {"lr": 5e-3}})  # a key the stage reads
    changed = make(tiny_repo, "train-single-fp32")
    assert stages_run(changed.stdout) == ["train@single-fp32-0"], changed.stdout


def test_an_unknown_variant_is_one_line_naming_the_valid_ones(tiny_repo):
    proc = run(["make", "train-single-fp64"], tiny_repo, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "unknown variant 'single-fp64'" in proc.stderr and "single-fp32" in proc.stderr and "ddp-bf16" in proc.stderr


def test_every_command_make_runs_keeps_the_compile_cache_in_the_users_cache(tiny_repo, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # `make test` itself sets it
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    show = ["make", "-s", "--eval", "show-cache: ; @echo $$TORCHINDUCTOR_CACHE_DIR", "show-cache"]
    home = tmp_path / "home"
    assert run(show, tiny_repo, env={"HOME": str(home)}).stdout.strip() == str(home / ".cache" / "fasttrain" / "torchinductor")
    xdg = run(show, tiny_repo, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert xdg.stdout.strip() == str(tmp_path / "xdg" / "fasttrain" / "torchinductor")
    moved = run(show, tiny_repo, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "elsewhere")})
    assert moved.stdout.strip() == str(tmp_path / "elsewhere")  # a user's own setting stands


def test_make_fast_runs_the_recipe_as_an_experiment_and_leaves_the_workspace_alone(tiny_repo):
    """`make fast` lays recipes/fast.yaml over params.yaml as `dvc exp run -S` flags: the experiment
    trains and evaluates single-bf16 with the recipe's values, params.yaml and the workspace's outputs
    stay as they were, and the table shows the headline figures. Here the recipe is a CPU-sized one
    with the real recipe's shape; its keys are what the real one is made of (tests/unit/test_config.py
    checks the real recipe's values)."""
    (tiny_repo / "recipes" / "fast.yaml").write_text(
        "data:\n  augment: true\ntrain:\n  epochs: 2\n  scheduler: onecycle\n  cycle_momentum: false\n"
        "  cuda_graphs: true\nrun:\n  checkpoint_every: 100\nevaluate:\n  flip_tta: true\n")
    params, status = (tiny_repo / "params.yaml").read_bytes(), run(["git", "status", "--porcelain"], tiny_repo).stdout
    out = make(tiny_repo, "fast", "SEED=7").stdout
    assert stages_run(out) == ["download", "evaluate@single-bf16-7", "train@single-bf16-7"], out
    assert (tiny_repo / "params.yaml").read_bytes() == params
    assert run(["git", "status", "--porcelain"], tiny_repo).stdout == status  # dvc.lock, outputs: all as they were
    assert not (tiny_repo / "models" / "seed7" / "single-bf16.pt").exists()  # a temporary workspace's
    header, exp = _experiments(out)[0], _experiments(out)[-1]
    assert header == ["experiment", "created", "train.epochs", "compare.seeds", "train s", "images/s", "test acc"]
    figures = dict(zip(header, exp))  # the evaluation's accuracy (flip TTA), not train's
    assert exp[0].startswith("└─ ") and (figures["train.epochs"], figures["compare.seeds"]) == ("2", "[7]"), exp
    assert 0 <= float(figures["test acc"]) <= 1
    assert float(figures["images/s"].replace(",", "")) > 0 and float(figures["train s"]) > 0
    assert max(map(len, out.splitlines()[-len(_experiments(out)):])) <= 120

    # the same again: DVC restores both stages from its run cache, so nothing is measured; a new seed measures
    cached = make(tiny_repo, "fast", "SEED=7").stdout
    assert stages_run(cached) == [], cached
    assert "Stage 'train@single-bf16-7' is cached - skipping run" in cached, cached
    seeded = make(tiny_repo, "fast", "SEED=8").stdout
    assert stages_run(seeded) == ["evaluate@single-bf16-8", "train@single-bf16-8"], seeded  # the data set as it was
    seeds = sorted(row[3] for row in _experiments(seeded) if row[0].startswith(("├─ ", "└─ ")))
    assert seeds == ["[7]", "[7]", "[8]"], seeds  # the first experiment, its restored copy, the new seed's
    assert (tiny_repo / "params.yaml").read_bytes() == params
    assert run(["git", "status", "--porcelain"], tiny_repo).stdout == status


def _experiments(out: str) -> list[list[str]]:
    """`fasttrain experiments`' table at the end of make's output, as cells (columns are 2+ spaces apart)."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if re.match(r"experiment\s+created\s", line))
    table = [re.split(r"\s{2,}", line.strip()) for line in lines[start:] if line.strip()]
    return [row for row in table if len(row) == len(table[0])]  # (not make's "Leaving directory" under make -w)


def test_make_fast_with_a_broken_recipe_stops_before_any_experiment(tiny_repo):
    (tiny_repo / "recipes" / "fast.yaml").write_text("train: {epochs: 2\n")
    proc = run(["make", "-o", ".venv/.installed", "fast"], tiny_repo, check=False)
    assert proc.returncode != 0 and "Running stage" not in proc.stdout, proc.stdout
    assert "overlay.py: error: recipes/fast.yaml is not YAML: " in proc.stderr, proc.stderr
    assert run(["dvc", "exp", "list", "--all-commits"], tiny_repo).stdout.strip() == ""


@pytest.mark.parametrize("seed", ["x", "-1", "1.5", "3 -S train.epochs=1"])
def test_make_fast_with_a_bad_seed_stops_before_any_experiment(tiny_repo, seed):
    proc = run(["make", "-o", ".venv/.installed", "fast", f"SEED={seed}"], tiny_repo, check=False)
    assert proc.returncode != 0 and "Running stage" not in proc.stdout, proc.stdout
    assert f"SEED={seed} is not a seed: use a whole number >= 0, e.g. make fast SEED=3" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert run(["dvc", "exp", "list", "--all-commits"], tiny_repo).stdout.strip() == ""
