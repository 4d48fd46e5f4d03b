"""Evaluate one variant's final model on the whole test set, in the variant's precision."""

from __future__ import annotations

import io
from dataclasses import dataclass

import click
import torch
import torch.nn.functional as F

from fasttrain import atomic, checkpoint, clock, config, parallel
from fasttrain.data import load_dataset
from fasttrain.errors import FasttrainError
from fasttrain.kernel_folder import kernel_folder
from fasttrain.layout import Layout
from fasttrain.loaders import loader_args, make_eval_loader
from fasttrain.models import build_model
from fasttrain.precision import AutocastForward, Precision
from fasttrain.variant import run_variant, seed_or_first, variant_options


@dataclass
class EvalResult:
    loss_sum: float
    confusion: torch.Tensor  # [classes, classes] counts, rows = true label, columns = prediction
    correct: torch.Tensor | None = None  # per_image: [N] 1 where the image was classified right, data set order

    @property
    def images(self) -> int:
        return int(self.confusion.sum())

    @property
    def accuracy(self) -> float:
        return float(self.confusion.diag().sum()) / max(1, self.images)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.images)

    def per_class_accuracy(self) -> list[float]:
        rows = self.confusion.sum(dim=1).clamp(min=1)
        return (self.confusion.diag().double() / rows).tolist()


@torch.no_grad()
@kernel_folder()  # (its first batch autotunes cuDNN's algorithms for the test set's shapes)
def evaluate_model(net: torch.nn.Module, loader, precision: Precision, rt: parallel.Runtime,
                   num_classes: int, flip_tta: bool = False, per_image: bool = False) -> EvalResult:
    """Counts summed over ranks; the eval loader gives each image to exactly one rank, unpadded,
    so the totals cover every test image exactly once at any world size. With `flip_tta` the
    logits are the mean of the image's and its mirror image's. With `per_image`, which images were
    classified right too: rank r had images r, r + world_size, ... in order (make_eval_loader)."""
    was_training = net.training
    net.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=rt.device)
    right = []
    for x, y in loader:
        with precision.autocast(rt.device.type):
            logits = net(x)
            if flip_tta:
                logits = (logits + net(x.flip(-1))) / 2
            loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        predicted = logits.argmax(dim=1)
        confusion += torch.bincount(y * num_classes + predicted, minlength=num_classes**2)
        if per_image:
            right.append(predicted == y)
    parallel.all_reduce(loss_sum, rt)
    parallel.all_reduce(confusion, rt)
    correct = None
    if per_image:
        correct = torch.zeros(int(confusion.sum()), dtype=torch.int32, device=rt.device)
        if right:
            correct[rt.rank::rt.world_size] = torch.cat(right).int()
        parallel.all_reduce(correct, rt)
        correct = correct.cpu()
    net.train(was_training)
    return EvalResult(float(loss_sum), confusion.view(num_classes, num_classes).cpu(), correct)


# the record's headline figures: metrics/eval/<variant>.json; the rest is diagnostics/eval/<variant>.json
HEADLINE = ("test_accuracy", "test_loss", "test_images")


def evaluate(params: config.Params, precision: Precision, rt: parallel.Runtime, layout: Layout) -> dict:
    variant = f"{rt.parallel}-{precision.name}"
    with clock.phase("prepare"):  # the data set and the model
        dataset = load_dataset(layout.dataset)
        saved = checkpoint.load(layout.model(variant), map_location=rt.device)
        model = build_model(params.model.name, len(dataset.classes)).to(rt.device)
        try:
            model.load_state_dict(saved["model"])
        except RuntimeError as e:
            raise FasttrainError(f"{layout.model(variant)} does not fit model.name = {params.model.name}: "
                                 f"{str(e).splitlines()[0]}") from None
    img_size = saved["config"]["train"]["img_size"]
    channels_last = saved["config"]["train"]["channels_last"]
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    net = parallel.wrap_for_inference(AutocastForward(model, precision), rt)
    loader = make_eval_loader(params.data.loader, dataset.test_images, dataset.test_labels,
                              batch_size=max(1, params.evaluate.batch_size // rt.world_size),
                              **loader_args(params, precision, rt.device, rt.rank, rt.world_size,
                                            img_size=img_size, channels_last=channels_last))
    with clock.phase("eval"):
        result = evaluate_model(net, loader, precision, rt, len(dataset.classes), params.evaluate.flip_tta,
                                per_image=True)
    if result.images != len(dataset.test_labels):
        raise FasttrainError(f"evaluated {result.images} images, expected {len(dataset.test_labels)}")
    metrics = {
        "variant": variant, "test_accuracy": round(result.accuracy, 6), "test_loss": round(result.loss, 6),
        "test_images": result.images, "flip_tta": params.evaluate.flip_tta,
        "per_class_accuracy": {c: round(a, 6) for c, a in zip(dataset.classes, result.per_class_accuracy(), strict=True)},
        "confusion_matrix": result.confusion.tolist(), "classes": dataset.classes,
        # per test image, in the data set's order: 1 = classified right; compare pairs two variants' by image
        "correct": "".join(map(str, result.correct.tolist())),
        "device": rt.device_name, "world_size": rt.world_size, "torch_version": torch.__version__,
        "process_seconds": clock.report(),  # this process's wall time by phase: start-up, data, evaluation
    }
    if rt.is_main:
        atomic.atomic_write_text(layout.confusion_plot(variant), _confusion_csv(result.confusion, dataset.classes),
                                 "the confusion matrix")
        atomic.write_record(metrics, HEADLINE, layout.eval_metrics(variant), layout.eval_diagnostics(variant),
                            "evaluation")
    parallel.barrier(rt)
    return metrics


def _confusion_csv(confusion: torch.Tensor, classes: list[str]) -> str:
    """One row per test image, the form DVC's confusion template counts."""
    out = io.StringIO()
    out.write("actual,predicted\n")
    for i, row in enumerate(confusion.tolist()):
        for j, count in enumerate(row):
            out.write(f"{classes[i]},{classes[j]}\n" * count)
    return out.getvalue()


@click.command("evaluate")
@variant_options
def main(parallel_name: str, precision_name: str, seed: int | None, params_path: str) -> None:
    """Test accuracy, loss, per-class accuracy and the confusion matrix of one variant's final model."""
    variant = f"{parallel_name}-{precision_name}"
    seed = seed_or_first(seed, config.load(params_path))
    model = Layout(seed=seed).model(variant)
    if not model.is_file():  # before any ddp worker starts
        raise FasttrainError(f"{model} not found: train the variant first (dvc repro evaluate@{variant}-{seed} "
                             f"trains and evaluates it; make train-{variant} trains it alone)")
    run_variant("evaluate", evaluate, parallel_name, precision_name, seed, params_path)
