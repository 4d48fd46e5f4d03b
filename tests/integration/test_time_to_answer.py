"""scripts/time_to_answer.py on a real `dvc repro` of a scratch repository: its table's figures are
the stages' own metrics, and its split adds up."""

import json
import sys

import pytest

from scratch import record, run

pytestmark = pytest.mark.slow


def test_time_to_answer_splits_each_stage_into_work_fixed_cost_and_the_time_around(tiny_repo, tmp_path):
    out = tmp_path / "tta.md"
    proc = run([sys.executable, "scripts/time_to_answer.py", "--out", str(out), "--", "dvc", "repro",
                "evaluate@single-fp32-0"], tiny_repo, timeout=600)
    assert "Running stage 'train@single-fp32-0'" in proc.stdout  # the command's own output, passed on
    text = out.read_text()
    assert text.startswith("\n## ") and "`dvc repro evaluate@single-fp32-0`" in text
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")
    ) if cells[0] != "stage"}
    assert list(rows) == ["download", "train@single-fp32-0", "evaluate@single-fp32-0"]
    train = record(tiny_repo, "single-fp32")["process_seconds"]
    wall, process, work, fixed, around = (float(x) for x in rows["train@single-fp32-0"][:5])
    assert process == pytest.approx(train["total"], abs=0.051)
    assert work == pytest.approx(train["train"] + train["eval"], abs=0.051)
    assert fixed == pytest.approx(process - work, abs=0.11) and around == pytest.approx(wall - process, abs=0.11)
    assert 0 < process < wall
    assert rows["download"][1] == ""  # no process_seconds in its outputs: its wall alone
    # a second run that runs nothing says so
    again = run([sys.executable, "scripts/time_to_answer.py", "--", "dvc", "repro", "evaluate@single-fp32-0"], tiny_repo)
    assert "0 stage(s) run" in again.stdout

    # an experiment in a temporary workspace: the diagnostics come from DVC's cache, by the hash
    # `dvc exp show` recorded for them
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    run(["git", "add", "-A"], tiny_repo)
    run(["git", "commit", "-qm", "the run"], tiny_repo, env=git)
    before = (tiny_repo / "diagnostics/train/seed0/single-fp32.json").read_bytes()
    exp = run([sys.executable, "scripts/time_to_answer.py", "--out", str(out), "--", "dvc", "exp", "run", "--temp",
               "-S", "compare.seeds=[5]", "train@single-fp32-5"], tiny_repo, timeout=600, env=git)
    assert "1 stage(s) run" in exp.stdout
    assert (tiny_repo / "diagnostics/train/seed0/single-fp32.json").read_bytes() == before  # the workspace's: untouched
    row = next(line for line in out.read_text().splitlines()[::-1] if line.startswith("| train@single-fp32-5 "))
    process = float(row.strip("|").split("|")[2])
    # the experiment's diagnostics: the one train diagnostics file in DVC's cache that the workspace lacks
    workspace = {p.read_bytes() for p in (tiny_repo / "diagnostics").rglob("*.json")}
    theirs = [json.loads(b) for b in (f.read_bytes() for f in (tiny_repo / ".dvc/cache").rglob("*") if f.is_file())
              if b not in workspace and b.startswith(b"{") and b'"process_seconds"' in b]
    assert len(theirs) == 1, len(theirs)
    assert process == pytest.approx(theirs[0]["process_seconds"]["total"], abs=0.051), row
