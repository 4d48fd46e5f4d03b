"""Evaluation against hand-made models whose answers are known: flip TTA's mean logits, per-class accuracy."""

import math
import threading

import pytest
import torch
from torch import nn

from fasttrain import checkpoint, config, parallel
from fasttrain.data import make_synthetic, save_dataset
from fasttrain.evaluate import EvalResult, evaluate, evaluate_model
from fasttrain.layout import Layout
from fasttrain.precision import PRECISIONS

CPU = parallel.Runtime("single", torch.device("cpu"))


class LeftRight(nn.Module):
    """Two-pixel images [left, right] -> logits [2 * left, right, 1.2]: not mirror-symmetric."""

    def forward(self, x):
        left, right = x[:, 0, 0, 0], x[:, 0, 0, 1]
        return torch.stack([2 * left, right, torch.full_like(left, 1.2)], dim=1)


def cross_entropy(logits: list[float], label: int) -> float:
    return math.log(sum(math.exp(v) for v in logits)) - logits[label]


# image A = [1, 0] (label 2), its mirror B = [0, 1] (label 1), C = [3, 0] (label 0), in two batches
BATCHES = [(torch.tensor([[[[1.0, 0.0]]], [[[0.0, 1.0]]]]), torch.tensor([2, 1])),
           (torch.tensor([[[[3.0, 0.0]]]]), torch.tensor([0]))]


@pytest.mark.parametrize("flip_tta", [False, True])
def test_flip_tta_gives_each_image_the_mean_of_its_and_its_mirrors_logits(flip_tta):
    result = evaluate_model(LeftRight(), BATCHES, PRECISIONS["fp32"], CPU, num_classes=3, flip_tta=flip_tta)
    if flip_tta:  # A and its mirror B both get ([2, 0, 1.2] + [0, 1, 1.2]) / 2; C gets ([6, 0, 1.2] + [0, 3, 1.2]) / 2
        logits = {"A": [1.0, 0.5, 1.2], "B": [1.0, 0.5, 1.2], "C": [3.0, 1.5, 1.2]}
        confusion = [[1, 0, 0], [0, 0, 1], [0, 0, 1]]  # A right (2), B wrong (2 for 1), C right (0)
    else:
        logits = {"A": [2.0, 0.0, 1.2], "B": [0.0, 1.0, 1.2], "C": [6.0, 0.0, 1.2]}
        confusion = [[1, 0, 0], [0, 0, 1], [1, 0, 0]]  # A wrong (0 for 2), B wrong (2 for 1), C right (0)
    assert result.confusion.tolist() == confusion
    assert result.accuracy == pytest.approx(2 / 3 if flip_tta else 1 / 3)
    expected_loss = cross_entropy(logits["A"], 2) + cross_entropy(logits["B"], 1) + cross_entropy(logits["C"], 0)
    assert result.loss_sum == pytest.approx(expected_loss, rel=1e-6)


def test_per_class_accuracy_is_each_true_class_share_predicted_right():
    # rows: true class; class 0: 3 of 4 right, class 1: 0 of 2, class 2: no images (0, not a division by zero)
    result = EvalResult(0.0, torch.tensor([[3, 1, 0], [2, 0, 0], [0, 0, 0]]))
    assert result.per_class_accuracy() == [0.75, 0.0, 0.0]
    assert result.accuracy == pytest.approx(3 / 6)


def _always_class_2(model: nn.Module) -> dict:
    """squeezenet1_1 whose last 1x1 conv gives 1 to class 2 and 0 to the rest, whatever the image."""
    conv = model.classifier[1]
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        conv.bias[2] = 1.0
    return model.state_dict()


@pytest.mark.parametrize("flip_tta", [False, True])
def test_evaluate_writes_per_class_accuracy_by_class_name_and_honours_flip_tta(tmp_path, monkeypatch, flip_tta):
    from fasttrain import evaluate as evaluate_module
    from fasttrain.models import build_model

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(20, 30, 32, 0), layout.dataset)  # balanced: 3 test images per class
    checkpoint.save({"model": _always_class_2(build_model("squeezenet1_1", 10)),
                     "config": {"train": {"img_size": 32, "channels_last": False}}}, layout.model("single-fp32"))
    params = config.from_dict({"data": {"source": "synthetic", "workers": 0, "pin_memory": False},
                               "model": {"name": "squeezenet1_1"}, "train": {"device": "cpu"},
                               "evaluate": {"batch_size": 10, "flip_tta": flip_tta}})
    inputs = []

    def build(*args, **kwargs):  # every batch the model is given
        model = build_model(*args, **kwargs)
        model.register_forward_pre_hook(lambda m, args: inputs.append(args[0].clone()))
        return model

    monkeypatch.setattr(evaluate_module, "build_model", build)
    metrics = evaluate(params, PRECISIONS["fp32"], parallel.setup("single", "cpu"), layout)

    assert metrics["per_class_accuracy"] == {f"class{c}": 1.0 if c == 2 else 0.0 for c in range(10)}
    assert metrics["test_accuracy"] == pytest.approx(0.1) and metrics["flip_tta"] is flip_tta
    assert [row[2] for row in metrics["confusion_matrix"]] == [3] * 10
    if flip_tta:  # each batch, then its mirror image
        assert len(inputs) == 6
        for x, mirrored in zip(inputs[::2], inputs[1::2], strict=True):
            assert torch.equal(mirrored, x.flip(-1)) and not torch.equal(mirrored, x)
    else:
        assert len(inputs) == 3


# LeftRight's classes for [left, right]: [1, 0] -> 0, [0, 1] -> 2, [3, 0] -> 0, [0, 4] -> 1, [2, 0] -> 0
IMAGES = torch.tensor([[[[1.0, 0.0]]], [[[0.0, 1.0]]], [[[3.0, 0.0]]], [[[0.0, 4.0]]], [[[2.0, 0.0]]]])
LABELS = torch.tensor([0, 1, 2, 1, 0])
RIGHT = [1, 0, 0, 1, 1]


class ThreadGroup:
    """all_reduce over threads that stand for ranks: each adds its tensor, all get the sum."""

    def __init__(self, world_size: int):
        self.barrier, self.slots = threading.Barrier(world_size), [None] * world_size

    def all_reduce(self, t: torch.Tensor, rt: parallel.Runtime, op: str = "sum") -> torch.Tensor:
        self.slots[rt.rank] = t.clone()
        self.barrier.wait()
        total = sum(self.slots)
        self.barrier.wait()
        return t.copy_(total)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_per_image_results_are_in_the_data_sets_order_at_any_world_size(monkeypatch, world_size):
    """Rank r evaluates images r, r + world_size, ... (make_eval_loader); the gathered results are
    each image's, in the data set's order, so compare can pair two variants image by image."""
    group = ThreadGroup(world_size)
    monkeypatch.setattr(parallel, "all_reduce", group.all_reduce)
    results = [None] * world_size

    def rank(r: int) -> None:
        rt = parallel.Runtime("ddp", torch.device("cpu"), rank=r, world_size=world_size)
        shard = [(IMAGES[r::world_size][i:i + 1], LABELS[r::world_size][i:i + 1])
                 for i in range(len(LABELS[r::world_size]))]
        results[r] = evaluate_model(LeftRight(), shard, PRECISIONS["fp32"], rt, num_classes=3, per_image=True)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for result in results:
        assert result.correct.tolist() == RIGHT
        assert result.correct.sum() == result.confusion.trace() == 3
