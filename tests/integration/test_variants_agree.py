"""On one device, `single`, `dp` and `ddp` (one process) are the same computation: the same initial
weights, the same batches in the same order, the same augmentation and dropout draws. So the
comparison table measures how each variant runs, never a different training run by chance; on the
GPU, only nondeterministic kernels (cuDNN's per-process algorithm choice, atomic adds) separate them.

On the CPU, `dp` *is* the single path: nn.DataParallel needs CUDA devices, so a dp run without a GPU
trains the bare model in one process and says so in its warnings. "dp equals single" below compares
one code path with itself; what it checks of dp is that fallback: the warning, one device, the same
curves and weights. (Without CUDA devices nn.DataParallel would only call the module, so the same
test cannot tell whether the model was wrapped.) The real DataParallel is checked
by the GPU-marked tests (test_dp_over_two_gpus_trains_as_single_does here, and test_precision's
replicas), and two-process ddp on two GPUs by test_ddp_over_two_gpus_trains_as_single_does; a CPU
run skips them and counts them (tests/conftest.py)."""

import csv

import pytest
import torch
import yaml
from scratch import TINY, record, run

DP_ON_CPU = "dp without a GPU runs as one process: nn.DataParallel needs CUDA devices"


def _train(tmp_path, parallels, **train) -> tuple[dict, dict, dict]:
    params = {**TINY, "data": {**TINY["data"], "augment": True},  # squeezenet1_1 has dropout, too
              "train": {**TINY["train"], "epochs": 2, "scheduler": "onecycle", **train}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run(["fasttrain", "download"], tmp_path)
    curves, weights, metrics = {}, {}, {}
    for parallel in parallels:
        run(["fasttrain", "train", "--parallel", parallel, "--precision", "fp32"], tmp_path, timeout=600)
        with open(tmp_path / "plots" / "train" / "seed0" / f"{parallel}-fp32.csv") as f:
            curves[parallel] = [(r["train_loss"], r["test_accuracy"], r["lr"]) for r in csv.DictReader(f)]
        weights[parallel] = torch.load(tmp_path / "models" / "seed0" / f"{parallel}-fp32.pt", weights_only=True)["model"]
        metrics[parallel] = record(tmp_path, f"{parallel}-fp32")
    return curves, weights, metrics


def test_single_dp_and_one_process_ddp_train_the_same_model(tmp_path):
    curves, weights, metrics = _train(tmp_path, ("single", "dp", "ddp"), device="cpu", nproc=1)

    assert metrics["dp"]["warnings"] == [DP_ON_CPU, "train.cuda_graphs: the CPU runs eagerly (CUDA graphs need a GPU)"]
    assert metrics["dp"]["device_count"] == 1  # the single path
    assert len(curves["single"]) == 2
    assert curves["dp"] == curves["single"] and curves["ddp"] == curves["single"]
    for parallel in ("dp", "ddp"):
        assert weights[parallel].keys() == weights["single"].keys()
        for name, tensor in weights["single"].items():
            assert torch.equal(weights[parallel][name], tensor), f"{parallel}: {name} differs"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dp_over_two_gpus_trains_as_single_does(tmp_path):
    """Real nn.DataParallel: each step's batch split over two replicas, gradients summed back on the
    first GPU. Only summation order differs from single, so the curves agree closely, not bit for bit."""
    curves, _, metrics = _train(tmp_path, ("single", "dp"), device="cuda", nproc=2)

    assert metrics["dp"]["device_count"] == 2 and DP_ON_CPU not in metrics["dp"]["warnings"]
    for (loss_dp, _, lr_dp), (loss, _, lr) in zip(curves["dp"], curves["single"], strict=True):
        assert float(loss_dp) == pytest.approx(float(loss), rel=1e-2) and lr_dp == lr


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ddp_over_two_gpus_trains_as_single_does(tmp_path):
    """Two NCCL ranks on GPUs 0 and 1, 16 images each, against single's 32 a step: the same batches
    in the same order (every rank draws the same permutation and augmentation), gradients averaged
    over the ranks. Dropout differs: each rank draws its own masks (seed + 1 + rank), so the runs
    are close, not equal: epoch losses within 5%, the same lr schedule, every weight finite."""
    curves, weights, metrics = _train(tmp_path, ("single", "ddp"), device="cuda", nproc=2)

    assert metrics["ddp"]["world_size"] == 2 and metrics["ddp"]["batch_size"] == metrics["single"]["batch_size"]
    for (loss_ddp, _, lr_ddp), (loss, _, lr) in zip(curves["ddp"], curves["single"], strict=True):
        assert float(loss_ddp) == pytest.approx(float(loss), rel=5e-2) and lr_ddp == lr
    assert all(torch.isfinite(t).all() for t in weights["ddp"].values())
