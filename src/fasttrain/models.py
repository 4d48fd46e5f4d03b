"""Model builders: any torchvision classification model by name. No dtype, no device here."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fasttrain import pool_kernel
from fasttrain.errors import FasttrainError
from fasttrain.vision import torchvision


@functools.cache
def classification_models() -> tuple[str, ...]:
    return tuple(torchvision.models.list_models(module=torchvision.models))


def build_model(name: str, num_classes: int) -> nn.Module:
    """A torchvision classification model by name, or your own as `FILE.py:FUNCTION` (a path
    relative to the repository, where the stages run) or `MODULE:FUNCTION` (an importable module):
    FUNCTION(num_classes=...) returns the nn.Module, which takes a batch of 3-channel images."""
    if ":" in name:
        return _own_model(name, num_classes)
    if name not in classification_models():
        raise FasttrainError(f"unknown model.name '{name}': choose a torchvision classification model, "
                             f"e.g. alexnet, resnet18, squeezenet1_1, shufflenet_v2_x0_5 "
                             f"(all {len(classification_models())}: torchvision.models.list_models()), "
                             f"or your own as path/to/file.py:function")
    # weights=None: the comparison trains from scratch, and nothing is fetched from a hub.
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def _own_model(name: str, num_classes: int) -> nn.Module:
    source, _, function = name.rpartition(":")
    try:
        if source.endswith(".py"):
            if not Path(source).is_file():
                raise FasttrainError(f"model.name '{name}': no file {source} (a path relative to the repository)")
            spec = importlib.util.spec_from_file_location(Path(source).stem, source)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except FasttrainError:
        raise
    except Exception as e:  # noqa: BLE001 (whatever the user's module raises while it imports)
        raise FasttrainError(f"model.name '{name}': importing {source} failed: {type(e).__name__}: {e}") from None
    build = getattr(module, function, None)
    if not callable(build):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise FasttrainError(f"model.name '{name}': {source} has no function {function}"
                             + (f" (it has: {', '.join(found)})" if found else ""))
    model = build(num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise FasttrainError(f"model.name '{name}': {function}(num_classes={num_classes}) returned a "
                             f"{type(model).__name__}, not a torch.nn.Module")
    return model


def first_conv(model: nn.Module, name: str) -> nn.Conv2d:
    """The convolution the image goes into; train.space_to_depth needs it to be a plain Conv2d on 3
    channels that comes first (alexnet, vgg, resnet; not a model that transforms its input first)."""
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None or conv.in_channels != 3 or conv.groups != 1 or getattr(model, "transform_input", False):
        raise FasttrainError(f"train.space_to_depth: true needs a model whose first layer is a 3-channel "
                             f"Conv2d, which {name} is not: set it to false")
    return conv


def space_to_depth(x: torch.Tensor, block: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, block*block*C, H/block, W/block): each block x block tile of pixels becomes
    one pixel of block*block*C channels, ordered (row in the tile, column in the tile, channel).
    Built from the channels_last view (N, H, W, C), so a channels_last input gives a channels_last
    output in one copy."""
    n, c, h, w = x.shape
    t = x.permute(0, 2, 3, 1).reshape(n, h // block, block, w // block, block, c)
    t = t.permute(0, 1, 3, 2, 4, 5).reshape(n, h // block, w // block, block * block * c)
    return t.permute(0, 3, 1, 2)


class SpaceToDepthConv2d(nn.Conv2d):
    """A strided Conv2d (train.space_to_depth) computed as a stride-1 convolution over the
    space-to-depth input. AlexNet's first layer, 11x11 at stride 4 on 3 channels, becomes a 3x3
    convolution on 48 channels: the same sums of the same products (the weight zero-padded to 12x12
    and cut into 4x4 tiles, the input tiled alike), but a shape that tensor cores fill, where 3
    channels leave them almost idle. Parameters, state_dict and checkpoints are the plain Conv2d's.

    Along one side, output i of the plain convolution is sum over t < k of xp[s*i + t] * w[t], with xp
    the input padded by p before it. With t = s*a + b (b < s, a < K = ceil(k / s)) that is
    sum over a, b of z[i + a][b] * w[s*a + b], where z[j][b] = xp[s*j + b]: a K-tap convolution of z.
    z needs xp up to s*(n + K - 1), n the output length; the padding after the input is whatever
    makes that length (it may cut input that no output reads)."""

    def _conv_forward(self, input, weight, bias):
        s, k, p = self.stride[0], self.kernel_size[0], self.padding[0]
        taps = -(-k // s)  # K
        h, w = input.shape[-2:]
        n_h, n_w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        length_h, length_w = s * (n_h + taps - 1), s * (n_w + taps - 1)
        x = F.pad(input, (p, length_w - w - p, p, length_h - h - p))  # negative: cut
        x = space_to_depth(x, s)
        o, c = weight.shape[:2]
        weight = F.pad(weight, (0, taps * s - k, 0, taps * s - k))
        weight = weight.reshape(o, c, taps, s, taps, s).permute(0, 3, 5, 1, 2, 4).reshape(o, s * s * c, taps, taps)
        if input.is_contiguous(memory_format=torch.channels_last):
            weight = weight.contiguous(memory_format=torch.channels_last)
        return F.conv2d(x, weight, bias, 1, 0)


def space_to_depth_first_conv(model: nn.Module, name: str) -> nn.Module:
    """Computes the model's first convolution the space-to-depth way (see SpaceToDepthConv2d)."""
    conv = first_conv(model, name)
    square = (conv.kernel_size[0] == conv.kernel_size[1] and conv.stride[0] == conv.stride[1]
              and not isinstance(conv.padding, str) and conv.padding[0] == conv.padding[1])
    if not square or conv.stride[0] < 2 or conv.dilation != (1, 1) or conv.padding_mode != "zeros":
        raise FasttrainError(f"train.space_to_depth: true needs a first convolution with a square kernel, "
                             f"one stride > 1 and plain zero padding, which {name}'s (kernel "
                             f"{conv.kernel_size}, stride {conv.stride}) is not: set it to false")
    conv.__class__ = SpaceToDepthConv2d
    return model


def _pool_geometry(pool: nn.MaxPool2d) -> tuple[tuple[int, int], ...]:
    """The pool's kernel size, stride (the kernel size where none is given), padding and dilation,
    each as a (height, width) pair."""
    return tuple(nn.modules.utils._pair(v) for v in (pool.kernel_size, pool.stride or pool.kernel_size,
                                                      pool.padding, pool.dilation))


def with_switches(model: nn.Module, cfg, name: str) -> nn.Module:
    """The model as train's switches make it (space_to_depth, fused_max_pool; `cfg` is
    the train section), each the same function and parameters. A switch the model cannot take is a
    one-line FasttrainError naming it: switches.decide builds it on the meta device."""
    if cfg.fused_max_pool:
        model = fused_max_pools(model, name)
    if cfg.space_to_depth:
        model = space_to_depth_first_conv(model, name)
    return model


class FusedReluMaxPool2d(nn.MaxPool2d):
    """A ReLU and this MaxPool2d (train.fused_max_pool; the ReLU before it made an nn.Identity) as
    pool_kernel's Triton kernels, one forward and one backward, where they run (CUDA tensors, or any
    under TRITON_INTERPRET=1); torch's ReLU and pool elsewhere. The same function, forward and
    backward (pool_kernel's docstring says why). Whether the kernels can run is found once, when the
    model is built, so that torch.compile sees a constant."""

    kernels: bool = False  # Triton importable
    interpret: bool = False  # TRITON_INTERPRET=1: the kernels run on any device's tensors

    def forward(self, input):
        if self.kernels and (input.is_cuda or self.interpret):
            return pool_kernel.relu_max_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode)[0]
        return super().forward(F.relu(input))


def _fusable(pool: nn.Module) -> bool:
    """A MaxPool2d that pool_kernel computes: square window, stride and padding; dilation 1."""
    if type(pool) is not nn.MaxPool2d or pool.return_indices:
        return False
    k, s, p, d = _pool_geometry(pool)
    return k[0] == k[1] and s[0] == s[1] and p[0] == p[1] and d == (1, 1)


def fused_max_pools(model: nn.Module, name: str) -> nn.Module:
    """Each ReLU that feeds a MaxPool2d in an nn.Sequential (AlexNet's conv -> ReLU -> pool) taken with
    the pool as one FusedReluMaxPool2d, the ReLU replaced by an nn.Identity. Neither layer has
    parameters or buffers, so the state dict keeps its keys and loads into the bare model. A pool that
    the kernels do not compute (dilation, returned indices, unequal sides) stays torch's."""
    kernels, interpret = pool_kernel.available(), pool_kernel.interpreted()
    fused = 0
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        keys = list(seq._modules)
        for a, b in zip(keys, keys[1:]):
            relu, pool = seq._modules[a], seq._modules[b]
            if isinstance(relu, nn.ReLU) and _fusable(pool):
                seq._modules[a] = nn.Identity()
                pool.__class__ = FusedReluMaxPool2d
                pool.kernel_size, pool.stride, pool.padding = (v[0] for v in _pool_geometry(pool)[:3])
                pool.kernels, pool.interpret = kernels, interpret
                fused += 1
    if not fused:
        raise FasttrainError(f"train.fused_max_pool: true needs a model whose ReLU feeds a MaxPool2d (square, "
                             f"dilation 1) in an nn.Sequential, which {name} is not: set it to false")
    return model


class _NoInitialisation(TorchFunctionMode):
    """While a model is built on the meta device (or, with `anywhere`, on any device): its
    initialisation (torch.nn.init, and in-place tensor methods such as normal_) is skipped. In place
    on a meta tensor it changes nothing that a meta tensor has, and some of it would run torch's
    reference ops, whose first call imports all of torch._dynamo: seconds of every stage's start-up."""

    def __init__(self, anywhere: bool = False):
        super().__init__()
        self.anywhere = anywhere

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        initialises = getattr(func, "__module__", "") == "torch.nn.init" or (
            name.endswith("_") and not name.startswith("_") and name not in ("resize_", "set_", "requires_grad_"))
        first = args[0] if args else kwargs.get("tensor")
        if initialises and isinstance(first, torch.Tensor) and (self.anywhere or first.is_meta):
            return first
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta():
    """Modules built inside are on the meta device and not initialised: their shapes for free."""
    with torch.device("meta"), _NoInitialisation():
        yield


def _shape_probe(name: str) -> nn.Module:
    """The model for the shapes it accepts alone: built in uninitialised CPU memory, so a check costs
    a forward of one image and no more. (Not on_meta then to_empty: to_empty of a meta tensor runs
    torch's reference ops, whose first call imports torch.fx's symbolic shapes and sympy, 0.8 s.)"""
    with _NoInitialisation(anywhere=True):
        model = build_model(name, 10)
    return model.eval()


def _accepts(model: nn.Module, size: int) -> bool:
    try:
        with torch.inference_mode():
            model(torch.zeros(1, 3, size, size))
        return True
    except (RuntimeError, ValueError):
        return False


@functools.cache
def min_img_size(name: str, limit: int = 512) -> int:
    """The smallest square input the model accepts (forwards of one image on the CPU)."""
    model = _shape_probe(name)
    if not _accepts(model, limit):
        return limit + 1
    lo, hi = 1, limit  # invariant: accepts(hi), and everything <= lo - 1 is rejected
    while lo < hi:
        mid = (lo + hi) // 2
        if _accepts(model, mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def check_img_size(name: str, img_size: int, key: str = "train.img_size") -> None:
    if _accepts(_shape_probe(name), img_size):  # one forward; the search only to say what is too small
        return
    smallest = min_img_size(name)
    if img_size < smallest:
        raise FasttrainError(f"{key} = {img_size} is too small for {name}: it needs at least {smallest}")
