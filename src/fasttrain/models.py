"""Model builders: any torchvision classification model by name. No dtype, no device here."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
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


PADDED_CHANNELS = 8  # train.pad_channels: bf16/fp16 channels_last convolutions want multiples of 8 (16 bytes)


class ChannelPaddedConv2d(nn.Conv2d):
    """A Conv2d that also takes its input with all-zero channels appended (train.pad_channels): it
    pads its weight with zeros to match, so the result is the same convolution of the real
    channels, and the gradient of the real weight is the padded one's first channels. Parameters,
    state_dict and checkpoints are the plain Conv2d's; a 3-channel input is convolved as before."""

    def _conv_forward(self, input, weight, bias):
        extra = input.shape[1] - weight.shape[1] * self.groups
        if extra > 0:
            weight = F.pad(weight, (0, 0, 0, 0, 0, extra))  # (W, H, then in-channels at the end)
        return super()._conv_forward(input, weight, bias)


def first_conv(model: nn.Module, name: str) -> nn.Conv2d:
    """The convolution the image goes into; train.pad_channels needs it to be a plain Conv2d on 3
    channels that comes first (alexnet, vgg, resnet; not a model that transforms its input first)."""
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None or conv.in_channels != 3 or conv.groups != 1 or getattr(model, "transform_input", False):
        raise FasttrainError(f"train.pad_channels: true needs a model whose first layer is a 3-channel "
                             f"Conv2d, which {name} is not: set it to false")
    return conv


def pad_first_conv(model: nn.Module, name: str) -> nn.Module:
    """Lets the model take input padded to PADDED_CHANNELS channels (see ChannelPaddedConv2d)."""
    first_conv(model, name).__class__ = ChannelPaddedConv2d
    return model


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
