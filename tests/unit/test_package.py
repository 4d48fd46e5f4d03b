"""pyproject.toml declares every third-party package that src/fasttrain imports (anywhere in a
module, lazily too), so a fresh `pip install` of the package has what its stages run."""

import ast
import importlib.metadata
import re
import sys
import tomllib

from stage_imports import PACKAGE

PYPROJECT = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
# Imported only where they are there: triton comes with torch's CUDA builds, and fasttrain's Triton
# kernels run only when it imports (batch_kernel.enabled, pool_kernel).
OPTIONAL = {"triton"}


def imported_top_level() -> set[str]:
    names = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"fasttrain"}


def declared() -> set[str]:
    return {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower().replace("_", "-")
            for d in PYPROJECT["project"]["dependencies"]}


def test_every_imported_package_is_declared():
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for name in sorted(imported_top_level() - OPTIONAL):
        dists = {d.lower().replace("_", "-") for d in distributions.get(name, [name])}
        if not dists & declared():
            missing[name] = sorted(dists)
    assert not missing, f"imported but not in pyproject's dependencies: {missing}"
    # torch.utils.tensorboard needs the tensorboard package itself
    assert "tensorboard" in declared()


def test_the_check_sees_lazy_imports():
    assert {"torch", "torchvision", "numpy", "PIL", "click", "yaml", "tqdm", "triton"} <= imported_top_level()


def test_dvc_reads_its_lock_file_with_the_c_parser():
    """dvc repro reads all of dvc.lock again at every stage; ruamel.yaml's pure-Python parser made that
    1.2 s more a stage in a 73-stage pipeline (the three-seed run) on a 2-core CPU."""
    from ruamel.yaml import YAML

    assert YAML(typ="safe").Parser.__name__ == "CParser"
