"""The `gpu` marker: without a CUDA GPU those tests are skipped, and the run ends by saying how many
GPU tests it skipped or deselected, so a CPU run says what it did not test."""

import pytest
import torch

_not_run = {"skipped": set(), "deselected": set()}


# The files that take longest (CI's --durations on its 2 cores), started first: `make test` hands
# out whole files to its workers in collection order (--dist loadfile --no-loadscope-reorder), and
# a long file started last would run alone at the end.
LONGEST_FIRST = ("integration/test_pipeline.py", "integration/test_live_queue.py", "integration/test_progressive.py",
                 "integration/test_dvc_machines.py", "integration/test_params_keys.py", "unit/test_pool_kernel.py",
                 "integration/test_check_accuracy.py", "integration/test_resume.py", "unit/test_engine.py",
                 "integration/test_make.py", "integration/test_faults.py")


def _rank(item) -> int:
    path = item.nodeid.split("::")[0].removeprefix("tests/")
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_deselected(items):
    _not_run["deselected"].update(item.nodeid for item in items if "gpu" in item.keywords)


def pytest_runtest_logreport(report):
    if report.skipped and "gpu" in report.keywords:
        _not_run["skipped"].add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    skipped, deselected = len(_not_run["skipped"]), len(_not_run["deselected"])
    if skipped or deselected:
        terminalreporter.write_line(
            f"GPU tests not run: {skipped} skipped, {deselected} deselected (CUDA available: "
            f"{torch.cuda.is_available()}). Real DataParallel, NCCL and CUDA kernels went untested here.")
