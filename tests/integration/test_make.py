"""`make train-<parallel>-<precision>` as Make and DVC users expect it, through the real make and dvc in
a scratch copy of the repo: nothing changed, nothing runs; FORCE=1 trains the variant again."""

import pytest

from scratch import run, set_params

pytestmark = pytest.mark.slow


def make(repo, *args):
    # -o: take this Python's environment as set up, so the scratch copy never builds a .venv of its own
    return run(["make", "-o", ".venv/.installed", *args], repo, timeout=600)


def stages_run(output: str) -> list[str]:
    return sorted(line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage"))


def test_train_target_runs_only_when_something_changed_and_force_trains_again(tiny_repo):
    first = make(tiny_repo, "train-single-fp32")
    assert stages_run(first.stdout) == ["download", "train@single-fp32"], first.stdout

    again = make(tiny_repo, "train-single-fp32")
    assert stages_run(again.stdout) == [], again.stdout

    forced = make(tiny_repo, "train-single-fp32", "FORCE=1")
    assert stages_run(forced.stdout) == ["train@single-fp32"], forced.stdout  # the data set is kept

    set_params(tiny_repo, {"train": {"lr": 5e-3}})  # a key the stage reads
    changed = make(tiny_repo, "train-single-fp32")
    assert stages_run(changed.stdout) == ["train@single-fp32"], changed.stdout


def test_an_unknown_variant_is_one_line_naming_the_valid_ones(tiny_repo):
    proc = run(["make", "train-single-fp64"], tiny_repo, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "unknown variant 'single-fp64'" in proc.stderr and "single-fp32" in proc.stderr and "ddp-bf16" in proc.stderr


def test_every_command_make_runs_keeps_the_compile_cache_in_the_repository(tiny_repo, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # `make test` itself sets it, for its checkout
    show = ["make", "-s", "--eval", "show-cache: ; @echo $$TORCHINDUCTOR_CACHE_DIR", "show-cache"]
    assert run(show, tiny_repo).stdout.strip() == str(tiny_repo / ".cache" / "torchinductor")
    moved = run(show, tiny_repo, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "elsewhere")})
    assert moved.stdout.strip() == str(tmp_path / "elsewhere")  # a user's own setting stands
    assert run(["git", "check-ignore", "-q", ".cache/torchinductor/x"], tiny_repo, check=False).returncode == 0
