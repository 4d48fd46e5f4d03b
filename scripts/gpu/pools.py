"""On a GPU: how fast is each way of taking AlexNet's max pools, forward and backward? In the fast
recipe's step the pools' backward kernels take about a fifth of the time, at a fraction of the
memory bandwidth (docs/results/alexnet_h200_2026-12-02_step-switches/).

Usage: python3 scripts/gpu/pools.py [--batch 512] [--size 227] [--dtype bf16] [--iters 50] [--out OUT.json]

Each of AlexNet's ReLU -> MaxPool2d pairs, fed a tensor of the shape the features give it at --size
(channels_last, --dtype), is timed forward and backward (the gradient of its input, through the
ReLU) in each of these ways:
  aten                eager F.max_pool2d: torch's own kernels
  aten-separable      eager SeparableMaxPool2d (rows, then columns)
  compiled            torch.compile of ReLU + pool: inductor's kernels (the recipe without separable_max_pool)
  compiled-separable  the same with SeparableMaxPool2d, as the recipe took them before fused_max_pool
  fused               ReLU + pool as pool_kernel's Triton kernels (train.fused_max_pool): the module the
                      model uses, so torch's layers where the kernels do not run (the CPU, unless
                      TRITON_INTERPRET=1); each row's "triton" says which ran
Every way is the same function: its output and input gradient are compared with aten's (max_abs_diff).
GB/s counts the least traffic a pass needs: x read and the pooled output written forward; the output's
gradient and x read, x's gradient written backward.
"""

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from fasttrain.engine import synchronize
from fasttrain import pool_kernel
from fasttrain.models import _pool_geometry, build_model, fused_max_pools

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WAYS = ("aten", "aten-separable", "compiled", "compiled-separable", "fused")


class SeparableMaxPool2d(nn.MaxPool2d):
    """A MaxPool2d taken as a max over each window's rows, then over those row maxima (what the
    switch train.separable_max_pool did until fused_max_pool replaced it). A window's maximum is the
    same either way. The gradient goes to the same pixel: torch's pooling takes the first maximum in
    reading order, and the first row holding the maximum, then its first column holding it, is that
    pixel. Only sums of gradients that reach one pixel from several windows may add in another order.
    Each pass looks at 3 pixels where the square window looks at 9."""

    def forward(self, input):
        k, s, p, d = _pool_geometry(self)
        rows = F.max_pool2d(input, (1, k[1]), (1, s[1]), (0, p[1]), (1, d[1]), self.ceil_mode)
        return F.max_pool2d(rows, (k[0], 1), (s[0], 1), (p[0], 0), (d[0], 1), self.ceil_mode)


def pool_inputs(size: int) -> list[tuple[nn.MaxPool2d, tuple[int, ...]]]:
    """Each MaxPool2d of AlexNet's features with the (C, H, W) of its input at `size` px (meta device)."""
    model = build_model("alexnet", 10).to("meta")
    shapes = []
    hooks = [m.register_forward_pre_hook(lambda m, args: shapes.append((m, tuple(args[0].shape[1:]))))
             for m in model.features if isinstance(m, nn.MaxPool2d)]
    with torch.no_grad():
        model.features(torch.empty(1, 3, size, size, device="meta"))
    for h in hooks:
        h.remove()
    return shapes


def way(name: str, pool: nn.MaxPool2d):
    if name == "fused":
        plain = nn.MaxPool2d(pool.kernel_size, pool.stride, pool.padding, pool.dilation, ceil_mode=pool.ceil_mode)
        return fused_max_pools(nn.Sequential(nn.ReLU(), plain), "ReLU + pool")
    separable = SeparableMaxPool2d(pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                                   ceil_mode=pool.ceil_mode)
    chosen = separable if name.endswith("separable") else pool
    fn = lambda x: chosen(F.relu(x))  # noqa: E731
    return torch.compile(fn, dynamic=False) if name.startswith("compiled") else fn


def time_way(fn, x: torch.Tensor, g: torch.Tensor, iters: int, device: torch.device) -> dict:
    def step():
        x.grad = None
        fn(x).backward(g)

    for _ in range(3):  # compile, cuDNN/inductor autotuning, allocator
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    synchronize(device)
    return {"ms": (time.perf_counter() - start) / iters * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--size", type=int, default=227)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None, help="JSON rows, one per layer and way")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    print(f"{'layer':<28} {'way':<20} {'ms':>8} {'GB/s':>8} {'max_abs_diff':>12}", flush=True)
    for i, (pool, chw) in enumerate(pool_inputs(args.size)):
        shape = (args.batch, *chw)
        # values on a coarse grid: ties in a window, as ReLU's zeros and bf16's rounding give
        x = (torch.randint(-8, 9, shape, device=device, generator=gen).to(dtype) / 4).contiguous(
            memory_format=torch.channels_last).requires_grad_()
        out = pool(F.relu(x))
        g = torch.randn(out.shape, device=device, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        out.backward(g)
        want_out, want_grad = out.detach(), x.grad.detach().clone()
        least = (3 * x.numel() + 2 * out.numel()) * x.element_size()
        for name in WAYS:
            fn = way(name, pool)
            row = {"layer": f"pool{i + 1} {list(shape)}", "way": name, "batch": args.batch, "size": args.size,
                   "dtype": args.dtype, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   "triton": name == "fused" and pool_kernel.enabled(x)}
            row.update(time_way(fn, x, g, args.iters, device))
            x.grad = None
            got = fn(x)
            got.backward(g)
            row["max_abs_diff"] = max(float((got.detach() - want_out).abs().max()),
                                      float((x.grad - want_grad).abs().max()))
            row["gb_per_s"] = least / row["ms"] / 1e6
            rows.append(row)
            print(f"{row['layer']:<28} {name:<20} {row['ms']:8.3f} {row['gb_per_s']:8.0f} {row['max_abs_diff']:12.3g}",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
