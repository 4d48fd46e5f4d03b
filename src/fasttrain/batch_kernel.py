"""The gpu loader's per-chunk work as one Triton kernel: gather + crop/flip + resize + convert.

The reference (``loaders.GpuLoader`` on the CPU, and on the GPU when Triton is missing or
``FASTTRAIN_FUSED_LOADER=0``) is a chain of tensor ops: ``index_select`` of the uint8 images,
``crop_flip`` on a zero-padded copy, ``float() / 255``, a layout change, ``F.interpolate`` to
``img_size`` in float32, then a cast to the autocast dtype. At batch 512 and 227 px that chain
writes a 316 MB float32 batch and reads it back to cast it. Here each output value is computed
once, from the four uint8 source pixels it needs (found through the sample's index, crop offsets
and flip bit), in float32, and stored once in the output dtype and layout: the only large memory
traffic left is that store.

A program makes a block of output pixels, each in all its channels, so the per-pixel work (sample,
crop, flip, bilinear weights) is done once per pixel, not once per value, and in int32: at about
80M values a batch, that index arithmetic, not the store, is what the kernel spends its
instructions on (docs/loader-kernel.md counts them: scripts/gpu/kernel_sass.py).

The arithmetic is PyTorch's bilinear ``align_corners=False`` (half-pixel centres, source index
clamped at 0, lambdas from the truncated index) on the uint8 values, divided by 255 at the end;
values agree with the reference to float32 rounding (1e-6), hence after the cast to within one
unit in the last place of bf16/fp16.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

DISABLE_ENV = "FASTTRAIN_FUSED_LOADER"  # "0": use the tensor-op chain on the GPU too (A/B timing)
BLOCK = 256  # output pixels per program (each in all its channels)
INT32_PIXELS = 2**31  # from this many output pixels on, pixel indices are int64 (WIDE)


def enabled(images: torch.Tensor) -> bool:
    """Whether the fused kernel serves batches of ``images``: CUDA tensors (or any, under
    TRITON_INTERPRET=1, which tests use), Triton importable, not switched off."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return False
    if not (images.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    return _kernel() is not None


@functools.cache
def _kernel():
    try:
        import triton
        import triton.language as tl
    except ImportError:  # a torch build without Triton: the tensor-op chain does the work
        return None

    @triton.jit
    def gather_crop_flip_resize(src, idx, dy, dx, flip, out, n_pix, scale_h, scale_w,
                                C: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
                                OH: tl.constexpr, OW: tl.constexpr, PAD: tl.constexpr,
                                AUGMENT: tl.constexpr, NHWC: tl.constexpr, WIDE: tl.constexpr,
                                BLOCK: tl.constexpr):
        # A program makes BLOCK output pixels, each in all C channels. The pixel's coordinates,
        # sample, crop, flip, four source offsets and bilinear weights are worked out once for its C
        # values, in int32 (WIDE: int64 past 2**31 pixels); only the memory offsets of the image and
        # the output are int64. The C loads of a pixel step through its channel planes, and each
        # channel is stored on its own.
        if WIDE:
            p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        else:
            p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        pmask = p < n_pix
        ox = p % OW
        t = p // OW
        oy = t % OH
        b = t // OH
        image = tl.load(idx + b, mask=pmask, other=0)
        # source coordinates in the (cropped) source image, as upsample_bilinear2d computes them
        sy = tl.maximum(scale_h * (oy.to(tl.float32) + 0.5) - 0.5, 0.0)
        sx = tl.maximum(scale_w * (ox.to(tl.float32) + 0.5) - 0.5, 0.0)
        y0 = sy.to(tl.int32)  # truncation == floor: sy >= 0
        x0 = sx.to(tl.int32)
        ly = sy - y0.to(tl.float32)
        lx = sx - x0.to(tl.float32)
        y1 = y0 + (y0 < H - 1).to(tl.int32)
        x1 = x0 + (x0 < W - 1).to(tl.int32)
        if AUGMENT:  # crop of the zero-padded image, read right to left when flipped
            oy_ = tl.load(dy + b, mask=pmask, other=PAD).to(tl.int32) - PAD
            ox_ = tl.load(dx + b, mask=pmask, other=PAD).to(tl.int32) - PAD
            fl = tl.load(flip + b, mask=pmask, other=0) != 0
            y0 = y0 + oy_
            y1 = y1 + oy_
            x0 = tl.where(fl, W - 1 - x0, x0) + ox_
            x1 = tl.where(fl, W - 1 - x1, x1) + ox_
        in_y0 = (y0 >= 0) & (y0 < H)
        in_y1 = (y1 >= 0) & (y1 < H)
        in_x0 = (x0 >= 0) & (x0 < W)
        in_x1 = (x1 >= 0) & (x1 < W)
        m00 = pmask & in_y0 & in_x0
        m01 = pmask & in_y0 & in_x1
        m10 = pmask & in_y1 & in_x0
        m11 = pmask & in_y1 & in_x1
        o00 = y0 * W + x0
        o01 = y0 * W + x1
        o10 = y1 * W + x0
        o11 = y1 * W + x1
        hy = 1.0 - ly
        hx = 1.0 - lx
        plane = src + image * (C * H * W)
        if NHWC:
            dst = out + p.to(tl.int64) * C
        else:
            dst = out + b.to(tl.int64) * (C * OH * OW) + (oy * OW + ox)
        for c in tl.static_range(C):
            v00 = tl.load(plane + o00, mask=m00, other=0).to(tl.float32)
            v01 = tl.load(plane + o01, mask=m01, other=0).to(tl.float32)
            v10 = tl.load(plane + o10, mask=m10, other=0).to(tl.float32)
            v11 = tl.load(plane + o11, mask=m11, other=0).to(tl.float32)
            v = (hy * (hx * v00 + lx * v01) + ly * (hx * v10 + lx * v11)) / 255.0  # the reference's order
            if NHWC:
                tl.store(dst + c, v.to(out.dtype.element_ty), mask=pmask)
            else:
                tl.store(dst + c * (OH * OW), v.to(out.dtype.element_ty), mask=pmask)
            plane += H * W

    return gather_crop_flip_resize


def gather_crop_flip_resize(images: torch.Tensor, idx: torch.Tensor, aug: torch.Tensor | None,
                            img_size: int, channels_last: bool, dtype: torch.dtype,
                            padding: int) -> torch.Tensor:
    """``images[idx]``, cropped/flipped by ``aug`` ([3, B]: row offset, column offset, flip bit
    into the image zero-padded by ``padding``; None: no augmentation), resized to ``img_size`` and
    scaled to [0, 1], as ``dtype`` [B, C, img_size, img_size] (channels_last when asked)."""
    _, c, h, w = images.shape
    b = idx.shape[0]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty((b, c, img_size, img_size), dtype=dtype, device=images.device,
                      memory_format=fmt)
    if b == 0:
        return out
    images = images.contiguous()
    dy, dx, flip = (aug[0], aug[1], aug[2]) if aug is not None else (idx, idx, idx)  # unused
    n_pix = b * img_size * img_size
    with torch.cuda.device(images.device) if images.is_cuda else contextlib.nullcontext():
        _kernel()[(-(-n_pix // BLOCK),)](
            images, idx, dy.contiguous(), dx.contiguous(), flip.contiguous(), out, n_pix,
            h / img_size, w / img_size, C=c, H=h, W=w, OH=img_size,
            OW=img_size, PAD=padding, AUGMENT=aug is not None, NHWC=channels_last and c > 1,
            WIDE=n_pix + BLOCK >= INT32_PIXELS, BLOCK=BLOCK)
    return out

