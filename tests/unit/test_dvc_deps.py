"""dvc.yaml's code deps are exactly what each stage runs: a module a stage imports and does not list
would leave the stage "up to date" after an edit to it (and `dvc repro` would restore old results
from the run cache); one it lists and does not import re-runs it for nothing."""

import pytest
import yaml

from stage_imports import PACKAGE, command_files, command_modules, direct_imports

DVC_YAML = PACKAGE.parents[1] / "dvc.yaml"
STAGES = yaml.safe_load(DVC_YAML.read_text())["stages"]


def code_deps(stage: dict) -> set[str]:
    return {d for d in stage["deps"] if d.startswith("src/")}


def command_of(stage: dict) -> str:
    words = stage["cmd"].split()
    assert words[0] == "fasttrain", stage["cmd"]
    return words[1]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_code_deps_are_its_import_closure(name):
    stage = STAGES[name]
    runs, listed = command_files(command_of(stage)), code_deps(stage)
    missing, extra = sorted(runs - listed), sorted(listed - runs)
    assert not missing and not extra, (
        f"dvc.yaml stage {name}: deps miss {missing} (the stage runs them) and list {extra} (it does not)")


def test_the_closure_follows_lazy_and_launched_imports():
    # a function-level import counts: the fused pool's Triton kernel is imported only when it runs
    assert "fasttrain.pool_triton" in command_modules("train")
    # ddp workers run `python -m fasttrain`, so __main__.py is part of every stage that launches them
    assert "fasttrain.__main__" in command_modules("train")
    parallel = (PACKAGE / "parallel.py").read_text()
    assert '"--module", "fasttrain"' in parallel and '"-m", "fasttrain"' in parallel
    # compare runs no torch, so none of the training code
    assert "fasttrain.train" not in command_modules("compare")
    # `from fasttrain import x` is the module x when there is one, else a name in the package
    assert "fasttrain.lease" in direct_imports("fasttrain.parallel")
