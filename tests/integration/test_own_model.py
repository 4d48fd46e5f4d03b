"""Your own model (model.name: path/to/file.py:function) through the real DVC, as the README says to
use it: its file added to the train and evaluate stages' deps, so an edit to it makes them stale."""

import json

import pytest

from scratch import run, set_params

pytestmark = pytest.mark.slow

NET = """\
from torch import nn


def small_cnn(num_classes):
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, num_classes))
"""


def test_your_own_model_trains_and_evaluates_through_dvc_and_its_file_is_a_dep(tiny_repo):
    (tiny_repo / "nets").mkdir()
    (tiny_repo / "nets" / "small.py").write_text(NET)
    set_params(tiny_repo, {"model": {"name": "nets/small.py:small_cnn"}})
    dvc_yaml = (tiny_repo / "dvc.yaml").read_text()
    deps = "    deps:\n      - data/dataset.pt\n"
    assert dvc_yaml.count(deps) == 2  # train's and evaluate's
    (tiny_repo / "dvc.yaml").write_text(dvc_yaml.replace(deps, deps + "      - nets/small.py\n"))
    out = run(["dvc", "repro", "evaluate@single-fp32-0"], tiny_repo, timeout=900).stdout
    assert "Running stage 'train@single-fp32-0'" in out and "Running stage 'evaluate@single-fp32-0'" in out, out
    ev = json.loads((tiny_repo / "metrics" / "eval" / "seed0" / "single-fp32.json").read_text())
    assert ev["test_images"] == 50 and 0 <= ev["test_accuracy"] <= 1

    with open(tiny_repo / "nets" / "small.py", "a") as f:
        f.write("# edited\n")
    stale = json.loads(run(["dvc", "status", "--json", "train@single-fp32-0", "evaluate@single-fp32-0"], tiny_repo).stdout)
    assert sorted(stale) == ["evaluate@single-fp32-0", "train@single-fp32-0"], stale
