"""The `gpu` marker: without a CUDA GPU those tests are skipped, and the run ends by saying how many
GPU tests it skipped or deselected, so a CPU run says what it did not test."""

import pytest
import torch

_not_run = {"skipped": set(), "deselected": set()}


def pytest_collection_modifyitems(config, items):
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
