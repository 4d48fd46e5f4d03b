"""A process that does not compile never imports torch._dynamo: it is 1.3-2.3 s of a process on a
2-core CPU, more on a GPU host (fasttrain/vision.py, models.on_meta and _shape_probe, engine.AdamW).
Each stage's real process reports what it imported as it exits: download, evaluate (its ddp launcher
and workers too), train single and the ddp launcher of train. A ddp worker that trains imports it
whatever fasttrain does: DistributedDataParallel's constructor asks torch._dynamo (torch 2.14)."""

import os
from pathlib import Path

import pytest

from scratch import REPO, run

pytestmark = pytest.mark.slow

PROBE = Path(__file__).parent / "module_probe"
COMPILER = ("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes")  # the last: with sympy, 0.8 s


def imported(folder: Path) -> dict[str, set[str]]:
    """command line -> the modules that process imported, for every process that wrote its list."""
    out = {}
    for f in folder.glob("*.txt"):
        argv, *modules = f.read_text().splitlines()
        out[f"{argv} ({f.stem})"] = set(modules)
    return out


def test_stages_that_do_not_compile_never_import_dynamo(tiny_repo, tmp_path):
    folder = tmp_path / "modules"
    folder.mkdir()
    env = {"FASTTRAIN_TEST_MODULES": str(folder),
           "PYTHONPATH": os.pathsep.join([str(PROBE), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for command in (["download"],
                    ["train", "--parallel", "single", "--precision", "fp32"],
                    ["evaluate", "--parallel", "single", "--precision", "fp32"],
                    ["train", "--parallel", "ddp", "--precision", "fp32"],
                    ["evaluate", "--parallel", "ddp", "--precision", "fp32"]):
        run(["fasttrain", *command], tiny_repo, env=env)
    processes = {argv: modules for argv, modules in imported(folder).items() if "fasttrain" in modules}
    assert len(processes) == 3 + 2 * (1 + 2), sorted(processes)  # ddp: a launcher and 2 workers
    for argv, modules in processes.items():
        assert {"torch", "torchvision"} <= modules, argv  # the list is the whole process's
        if "__main__.py train" in argv:
            continue  # a ddp worker: DistributedDataParallel() itself imports torch._dynamo
        loaded = sorted(m for m in modules if any(m == c or m.startswith(c + ".") for c in COMPILER))
        assert not loaded, f"{argv} imported {loaded[:3]}"
