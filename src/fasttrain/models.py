"""Model builders: any torchvision classification model by name. No dtype, no device here."""

from __future__ import annotations

import functools

import torch
import torchvision
from torch import nn

from fasttrain.errors import FasttrainError


@functools.cache
def classification_models() -> tuple[str, ...]:
    return tuple(torchvision.models.list_models(module=torchvision.models))


def build_model(name: str, num_classes: int) -> nn.Module:
    if name not in classification_models():
        raise FasttrainError(f"unknown model.name '{name}': choose a torchvision classification model, "
                             f"e.g. alexnet, resnet18, squeezenet1_1, shufflenet_v2_x0_5 "
                             f"(all {len(classification_models())}: torchvision.models.list_models())")
    # weights=None: the comparison trains from scratch, and nothing is fetched from a hub.
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


@functools.cache
def min_img_size(name: str, limit: int = 512) -> int:
    """The smallest square input the model accepts, found by forwards on the meta device (free)."""
    model = build_model(name, 10).to("meta").eval()

    def accepts(size: int) -> bool:
        try:
            with torch.no_grad():
                model(torch.empty(1, 3, size, size, device="meta"))
            return True
        except (RuntimeError, ValueError):
            return False

    if not accepts(limit):
        return limit + 1
    lo, hi = 1, limit  # invariant: accepts(hi), and everything <= lo - 1 is rejected
    while lo < hi:
        mid = (lo + hi) // 2
        if accepts(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def check_img_size(name: str, img_size: int, key: str = "train.img_size") -> None:
    smallest = min_img_size(name)
    if img_size < smallest:
        raise FasttrainError(f"{key} = {img_size} is too small for {name}: it needs at least {smallest}")
