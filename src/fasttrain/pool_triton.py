"""pool_kernel's Triton kernels (train.fused_max_pool): ReLU followed by a max pool, forward and
backward. pool_kernel's docstring says what each computes and why it is torch's function; it imports
this module only where Triton is importable."""

import triton
import triton.language as tl


@triton.jit
def tile(ROWS, COLS, C, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile: image n, its row r of ROWS, a [BLOCK_W, BLOCK_C] block of (column,
    channel) indices, and which of them lie inside the COLS x C row."""
    row = tl.program_id(0)  # n * ROWS + r
    n = row // ROWS
    r = row - n * ROWS
    col = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)[:, None]
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    return n, r, col, c, (col < COLS) & (c < C)


@triton.jit
def relu_max_pool_forward(x, out, arg, H, W, OH, OW, C,
                          sxn, sxc, sxh, sxw, son, soc, soh, sow,
                          K: tl.constexpr, S: tl.constexpr, P: tl.constexpr,
                          BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    n, oh, ow, c, inside = tile(OH, OW, C, BLOCK_W, BLOCK_C)
    src = x + n.to(tl.int64) * sxn + c * sxc
    best = tl.full([BLOCK_W, BLOCK_C], float("-inf"), tl.float32)
    at = tl.full([BLOCK_W, BLOCK_C], 0, tl.int32)
    for kh in tl.static_range(K):
        h = oh * S - P + kh
        for kw in tl.static_range(K):
            w = ow * S - P + kw
            ok = inside & (h >= 0) & (h < H) & (w >= 0) & (w < W)
            v = tl.load(src + h * sxh + w * sxw, mask=ok, other=float("-inf")).to(tl.float32)
            take = ok & ((v > best) | (v != v))  # torch's pool: the first maximum, or a NaN
            best = tl.where(take, v, best)
            at = tl.where(take, kh * K + kw, at)
    no_gradient = best <= 0.0  # ReLU's output is 0 there (NaN: false, as in threshold_backward)
    dst = n.to(tl.int64) * son + oh * soh + ow * sow + c * soc
    tl.store(out + dst, tl.where(no_gradient, 0.0, best).to(out.dtype.element_ty), mask=inside)
    tl.store(arg + dst, tl.where(no_gradient, -1, at).to(tl.int8), mask=inside)


@triton.jit
def relu_max_pool_backward(grad_out, arg, grad_in, H, W, OH, OW, C,
                           sgn, sgc, sgh, sgw, san, sac, sah, saw, sin, sic, sih, siw,
                           K: tl.constexpr, S: tl.constexpr, P: tl.constexpr, FLOAT64: tl.constexpr,
                           BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    n, h, w, c, inside = tile(H, W, C, BLOCK_W, BLOCK_C)
    n64 = n.to(tl.int64)
    if FLOAT64:  # a float64 gradient is summed in float64, any other in float32
        acc = tl.zeros([BLOCK_W, BLOCK_C], tl.float64)
    else:
        acc = tl.zeros([BLOCK_W, BLOCK_C], tl.float32)
    R: tl.constexpr = (K + S - 1) // S  # the most windows along one axis that hold a pixel
    for i in tl.static_range(R):  # window rows ascending, then columns: torch's order
        oh = (h + P) // S - (R - 1 - i)
        kh = h + P - oh * S
        row_ok = (oh >= 0) & (oh < OH) & (kh < K)
        for j in tl.static_range(R):
            ow = (w + P) // S - (R - 1 - j)
            kw = w + P - ow * S
            ok = inside & row_ok & (ow >= 0) & (ow < OW) & (kw < K)
            a = tl.load(arg + n64 * san + oh * sah + ow * saw + c * sac, mask=ok, other=-1)
            g = tl.load(grad_out + n64 * sgn + oh * sgh + ow * sgw + c * sgc, mask=ok, other=0.0)
            acc += tl.where(a.to(tl.int32) == kh * K + kw, g.to(acc.dtype), 0.0)
    tl.store(grad_in + n64 * sin + h * sih + w * siw + c * sic, acc.to(grad_in.dtype.element_ty), mask=inside)
