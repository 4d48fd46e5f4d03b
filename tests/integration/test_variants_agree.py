"""On one device, `single`, `dp` and `ddp` (one process) are the same computation: the same initial
weights, the same batches in the same order, the same augmentation and dropout draws. So the
comparison table measures how each variant runs, never a different training run by chance; on the
GPU, only nondeterministic kernels (cuDNN's per-process algorithm choice, atomic adds) separate them."""

import csv

import torch
import yaml
from scratch import TINY, run


def test_single_dp_and_one_process_ddp_train_the_same_model(tmp_path):
    params = {**TINY, "data": {**TINY["data"], "augment": True},  # squeezenet1_1 has dropout, too
              "train": {**TINY["train"], "epochs": 2, "scheduler": "onecycle", "device": "cpu", "nproc": 1}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run(["fasttrain", "download"], tmp_path)
    curves, weights = {}, {}
    for parallel in ("single", "dp", "ddp"):
        run(["fasttrain", "train", "--parallel", parallel, "--precision", "fp32"], tmp_path, timeout=600)
        with open(tmp_path / "plots" / "train" / f"{parallel}-fp32.csv") as f:
            curves[parallel] = [(r["train_loss"], r["test_accuracy"], r["lr"]) for r in csv.DictReader(f)]
        weights[parallel] = torch.load(tmp_path / "models" / f"{parallel}-fp32.pt", weights_only=True)["model"]

    assert len(curves["single"]) == 2
    assert curves["dp"] == curves["single"] and curves["ddp"] == curves["single"]
    for parallel in ("dp", "ddp"):
        assert weights[parallel].keys() == weights["single"].keys()
        for name, tensor in weights["single"].items():
            assert torch.equal(weights[parallel][name], tensor), f"{parallel}: {name} differs"
