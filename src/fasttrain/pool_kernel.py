"""ReLU followed by a max pool (AlexNet's ``ReLU -> MaxPool2d(3, 2)``), as one Triton kernel forward
and one backward (train.fused_max_pool).

Compiled, each pool's backward is inductor's kernel: for every input pixel it looks at each window
that may hold it and compares the window's saved choice with the pixel's place, and the ReLU's
mask comes on top. On an H200 at the fast recipe's batch those kernels moved about 1 TB/s, a fifth
of the step (docs/fast-recipe.md, "Step speed"). Here:

- forward: a program takes one output row of one image, a [BLOCK_W, BLOCK_C] tile of its (column,
  channel) values; channels are the contiguous axis in channels_last, so every load and store is a
  vector. For each output it stores ``relu(max)`` and one int8: the window position (kh * K + kw) of
  the first maximum in reading order, or -1 where the ReLU gives no gradient (the maximum <= 0).
- backward: a program takes one input row of one image; each pixel sums, in float32 and in the
  order torch's pooling does (window rows, then columns, ascending), the output gradients of the
  windows whose saved position is that pixel (float64 for a float64 gradient), and stores the sum
  once. No atomics, no zero fill.

The same function as ``max_pool2d(relu(x))`` forward and backward: the window's maximum of relu(x)
is relu of the maximum of x; where it is positive, the first pixel in reading order holding it is
the first holding x's maximum, which is where torch's pool sends the gradient, and ReLU passes it;
where it is not, ReLU's backward (``threshold_backward``: zero where its output is <= 0) gives
none. NaN follows torch too: a NaN is taken as the maximum (the last one in the window) and its
gradient passes, since NaN <= 0 is false. A pixel in several windows gets their gradients added
in float32 in torch's order, then rounded once to the gradient's dtype.

The kernels are in ``pool_triton``, imported only where Triton is; this module registers them as
torch custom operators. ``enabled`` says where they run: CUDA tensors (or any under
TRITON_INTERPRET=1, which the tests use on the CPU) with Triton importable. The module
``models.FusedReluMaxPool2d`` takes torch's ReLU and pool elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

BLOCK_W = 16  # columns of a tile (output columns forward, input columns backward)
MAX_BLOCK_C = 64  # channels of a tile: 64 bf16 values, a 128-byte line


def available() -> bool:
    """Whether Triton is importable, so that the kernels can be built."""
    return _kernels() is not None


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET=1, as the tests do on a CPU),
    on tensors of any device."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def enabled(x: torch.Tensor) -> bool:
    """Whether the Triton kernels serve ``x``: a CUDA tensor (or any, interpreted), with Triton
    importable."""
    return (x.is_cuda or interpreted()) and available()


@functools.cache
def _kernels():
    try:
        from fasttrain import pool_triton
    except ImportError:  # a torch build without Triton
        return None
    return pool_triton.relu_max_pool_forward, pool_triton.relu_max_pool_backward


def output_size(size: int, kernel_size: int, stride: int, padding: int, ceil_mode: bool = False) -> int:
    """torch's pooled size along one axis (dilation 1): in ceil mode a last, partial window counts
    too, if it starts inside the input or its left padding."""
    out = (size + 2 * padding - kernel_size + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _like(x: torch.Tensor, shape, dtype) -> torch.Tensor:
    """An empty tensor of `shape` and `dtype` in x's memory format (channels_last or contiguous)."""
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    return torch.empty(shape, dtype=dtype, device=x.device, memory_format=fmt)


def _tiles(h_rows: int, width: int, channels: int):
    """The grid (rows, column blocks, channel blocks) and the channel block: the next power of two
    of `channels`, at most MAX_BLOCK_C."""
    block_c = min(1 << max(channels - 1, 0).bit_length(), MAX_BLOCK_C)
    return (h_rows, -(-width // BLOCK_W), -(-channels // block_c)), block_c


def _on(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


@torch.library.custom_op("fasttrain::relu_max_pool2d", mutates_args=())
def relu_max_pool2d(x: torch.Tensor, kernel_size: int, stride: int, padding: int,
                    ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``max_pool2d(relu(x), kernel_size, stride, padding, ceil_mode=ceil_mode)`` and, per output, the
    int8 window position its gradient goes to (-1: none)."""
    n, c, h, w = x.shape
    oh, ow = (output_size(s, kernel_size, stride, padding, ceil_mode) for s in (h, w))
    out, arg = _like(x, (n, c, oh, ow), x.dtype), _like(x, (n, c, oh, ow), torch.int8)
    if out.numel():
        grid, block_c = _tiles(n * oh, ow, c)
        with _on(x):
            _kernels()[0][grid](x, out, arg, h, w, oh, ow, c, *_nchw(x), *_nchw(out), K=kernel_size, S=stride,
                                P=padding, BLOCK_W=BLOCK_W, BLOCK_C=block_c)
    return out, arg


@relu_max_pool2d.register_fake
def _(x, kernel_size, stride, padding, ceil_mode=False):
    n, c, h, w = x.shape
    oh, ow = (output_size(s, kernel_size, stride, padding, ceil_mode) for s in (h, w))
    return _like(x, (n, c, oh, ow), x.dtype), _like(x, (n, c, oh, ow), torch.int8)


@torch.library.custom_op("fasttrain::relu_max_pool2d_backward", mutates_args=())
def relu_max_pool2d_backward(grad_out: torch.Tensor, arg: torch.Tensor, height: int, width: int,
                             kernel_size: int, stride: int, padding: int) -> torch.Tensor:
    """The gradient of relu_max_pool2d's input (height x width) from its output's gradient."""
    n, c, oh, ow = grad_out.shape
    grad_in = _like(arg, (n, c, height, width), grad_out.dtype)
    if grad_in.numel():
        grid, block_c = _tiles(n * height, width, c)
        with _on(grad_out):
            _kernels()[1][grid](grad_out, arg, grad_in, height, width, oh, ow, c, *_nchw(grad_out), *_nchw(arg),
                                *_nchw(grad_in), K=kernel_size, S=stride, P=padding,
                                FLOAT64=grad_out.dtype == torch.float64, BLOCK_W=BLOCK_W, BLOCK_C=block_c)
    return grad_in


@relu_max_pool2d_backward.register_fake
def _(grad_out, arg, height, width, kernel_size, stride, padding):
    n, c = grad_out.shape[:2]
    return _like(arg, (n, c, height, width), grad_out.dtype)


def _nchw(t: torch.Tensor) -> tuple[int, int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _setup_context(ctx, inputs, output):
    x, ctx.kernel_size, ctx.stride, ctx.padding, _ceil_mode = inputs  # (the output's shape has it)
    ctx.height, ctx.width = x.shape[2:]
    ctx.save_for_backward(output[1])


def _backward(ctx, grad_out, _grad_arg):
    (arg,) = ctx.saved_tensors
    grad_in = relu_max_pool2d_backward(grad_out, arg, ctx.height, ctx.width, ctx.kernel_size, ctx.stride,
                                       ctx.padding)
    return grad_in, None, None, None, None


relu_max_pool2d.register_autograd(_backward, setup_context=_setup_context)
