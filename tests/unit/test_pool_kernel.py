"""The fused ReLU + max pool kernels (train.fused_max_pool) against torch's ReLU and pool.

On a machine without a GPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set in
a child pytest, since Triton reads it when the kernels are defined); with a GPU they run for real.
The interpreter rounds float32 to bfloat16 toward zero where the GPU rounds to nearest, so bf16
cases run on the GPU only.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torchvision

import fasttrain
from fasttrain import pool_kernel
from fasttrain.errors import FasttrainError
from fasttrain.models import FusedReluMaxPool2d, build_model, fused_max_pools

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RUNS_KERNEL = torch.cuda.is_available() or INTERPRETED
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_kernel = pytest.mark.skipif(not RUNS_KERNEL, reason="needs CUDA or TRITON_INTERPRET=1")

CASES = [  # dtype, channels_last, (N, C, H, W), kernel_size, stride, padding, ceil_mode
    (torch.float32, True, (2, 64, 27, 27), 3, 2, 0, False),  # AlexNet's pools: 3x3, stride 2, odd sides
    (torch.float32, True, (2, 70, 13, 12), 3, 2, 0, False),  # channels past one tile, not a power of 2
    (torch.float64, True, (2, 5, 9, 11), 3, 2, 1, False),  # padding; float64 sums in float64
    (torch.float32, False, (2, 5, 13, 13), 3, 2, 0, False),  # contiguous (NCHW)
    (torch.float32, True, (1, 4, 8, 8), 2, 2, 0, False),  # windows that do not overlap
    (torch.float32, True, (1, 4, 7, 7), 3, 1, 1, False),  # a pixel in up to 9 windows
    (torch.float16, True, (3, 16, 15, 15), 3, 2, 0, False),
    (torch.float32, True, (2, 6, 14, 16), 3, 2, 0, True),  # ceil mode (squeezenet's pools): a last, partial window
    (torch.float64, True, (1, 4, 10, 9), 3, 2, 1, True),  # ceil mode with padding
] + ([(torch.bfloat16, True, (64, 64, 55, 55), 3, 2, 0, False)] if torch.cuda.is_available() else [])  # pool 1


def _grid_input(shape, dtype, channels_last, seed=0):
    """Values on a coarse grid, half of them <= 0: windows hold ties, positive and zero, and windows
    whose ReLU gives no gradient."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(-6, 7, shape, generator=g) / 2).to(dtype).to(DEVICE)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _torch_pool(x, grad, k, s, p, dtype=None, ceil_mode=False):
    """torch's ReLU + max_pool2d output and input gradient (computed in `dtype`, default x's)."""
    t = x.detach().to(dtype or x.dtype).requires_grad_()
    out = F.max_pool2d(F.relu(t), k, s, p, ceil_mode=ceil_mode)
    out.backward(grad.to(out.dtype))
    return out.detach(), t.grad


@needs_kernel
@pytest.mark.parametrize("dtype, channels_last, shape, k, s, p, ceil", CASES)
def test_the_kernels_are_torchs_relu_and_max_pool(dtype, channels_last, shape, k, s, p, ceil):
    """The output bit for bit. The input gradient bit for bit against torch's pool in float32 and
    float64 (on the CPU, and on the GPU in every dtype: both sum a pixel's gradients in the same
    order, in float32 for half precision); in half precision also against float64 summing the same
    gradients, rounded once (a sum of a few bf16/fp16 values is exact in float32)."""
    x = _grid_input(shape, dtype, channels_last).requires_grad_()
    out, arg = pool_kernel.relu_max_pool2d(x, k, s, p, ceil)
    want_out = F.max_pool2d(F.relu(x.detach()), k, s, p, ceil_mode=ceil)
    assert torch.equal(out, want_out)
    assert out.dtype == dtype and arg.dtype == torch.int8 and out.shape == arg.shape == want_out.shape
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt) and arg.is_contiguous(memory_format=fmt)
    assert (arg == -1).any() and (arg >= 0).any()  # windows without a gradient, and with one

    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    out.backward(grad)
    assert x.grad.dtype == dtype and x.grad.is_contiguous(memory_format=fmt)
    _, exact = _torch_pool(x, grad, k, s, p, torch.float64, ceil)
    assert (exact != 0).any() and (exact == 0).any()
    if dtype in (torch.float32, torch.float64) or x.is_cuda:
        assert torch.equal(x.grad, _torch_pool(x, grad, k, s, p, ceil_mode=ceil)[1])
    if dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert torch.equal(x.grad, exact.to(dtype))


@needs_kernel
def test_an_output_gradient_in_another_layout_gives_the_same_input_gradient():
    """A channels_last input whose pooled output's gradient comes contiguous (as a flatten's does)."""
    x = _grid_input((2, 8, 13, 13), torch.float32, True).requires_grad_()
    out = pool_kernel.relu_max_pool2d(x, 3, 2, 0)[0]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE).contiguous()
    assert not grad.is_contiguous(memory_format=torch.channels_last)
    out.backward(grad)
    assert torch.equal(x.grad, _torch_pool(x, grad, 3, 2, 0)[1])


@needs_kernel
def test_nan_and_infinities_go_where_torchs_pool_sends_them():
    x = _grid_input((1, 3, 9, 9), torch.float32, True)
    x[0, 0, 1, 1] = float("nan")  # the maximum of its windows; its gradient passes ReLU (NaN <= 0 is false)
    x[0, 0, 4, 4], x[0, 0, 4, 5] = float("nan"), float("nan")  # the later NaN of a window takes it
    x[0, 1, 2, 2], x[0, 1, 6, 6] = float("inf"), float("-inf")
    x[0, 2] = float("-inf")  # every window at -inf: output 0, no gradient
    x.requires_grad_()
    out = pool_kernel.relu_max_pool2d(x, 3, 2, 0)[0]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out.backward(grad)
    want_out, want_grad = _torch_pool(x, grad, 3, 2, 0)
    assert torch.equal(out.isnan(), want_out.isnan()) and out.isnan().sum() >= 2
    assert torch.equal(out.nan_to_num(), want_out.nan_to_num())
    assert torch.equal(x.grad, want_grad)
    assert (out[0, 2] == 0).all() and (x.grad[0, 2] == 0).all()


@needs_kernel
def test_an_empty_batch_gives_empty_tensors():
    x = torch.zeros(0, 4, 9, 9, device=DEVICE, requires_grad=True)
    out = pool_kernel.relu_max_pool2d(x, 3, 2, 0)[0]
    assert out.shape == (0, 4, 4, 4)
    out.sum().backward()
    assert x.grad.shape == x.shape


def _alexnets(dtype=torch.float32, device=DEVICE):
    torch.manual_seed(0)
    plain = build_model("alexnet", 10).to(device, dtype).eval()  # eval: no dropout
    fused = fused_max_pools(build_model("alexnet", 10), "alexnet").to(device, dtype).eval()
    fused.load_state_dict(plain.state_dict())  # strict: the same keys
    return (m.to(memory_format=torch.channels_last) for m in (plain, fused))


@needs_kernel
def test_fused_alexnet_is_the_same_net_bit_for_bit():
    """AlexNet with its three ReLU + pool pairs fused: the same logits and parameter gradients, bit
    for bit (the pools' gradients are; the layers around them are torch's in both)."""
    plain, fused = _alexnets()
    kinds = [type(m).__name__ for m in fused.features]
    assert kinds == ["Conv2d", "Identity", "FusedReluMaxPool2d", "Conv2d", "Identity", "FusedReluMaxPool2d",
                     "Conv2d", "ReLU", "Conv2d", "ReLU", "Conv2d", "Identity", "FusedReluMaxPool2d"]
    assert all(m.kernels for m in fused.modules() if isinstance(m, FusedReluMaxPool2d))
    x = _grid_input((2, 3, 227, 227), torch.float32, True)
    out, out_fused = plain(x), fused(x)
    assert torch.equal(out_fused, out)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out.backward(g), out_fused.backward(g)
    for (key, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert torch.equal(q.grad, p.grad), key


def test_fused_alexnet_loads_into_a_bare_torchvision_alexnet():
    _, fused = _alexnets(device="cpu")
    bare = torchvision.models.alexnet(num_classes=10).eval().to(memory_format=torch.channels_last)
    bare.load_state_dict(fused.state_dict())  # strict
    x = torch.rand(2, 3, 227, 227).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(fused(x), bare(x), rtol=0, atol=0)


def test_without_the_kernels_the_module_is_torchs_relu_and_pool(monkeypatch):
    """On the CPU without the interpreter (or without Triton) the fused module takes torch's layers."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pool = fused_max_pools(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2)), "toy")[1]
    assert isinstance(pool, FusedReluMaxPool2d) and not pool.interpret
    assert not pool_kernel.enabled(torch.zeros(1))
    calls = []
    monkeypatch.setattr(pool_kernel, "relu_max_pool2d", lambda *a: calls.append(a))
    x = torch.randn(2, 4, 9, 9)
    assert torch.equal(pool(x), F.max_pool2d(F.relu(x), 3, 2)) and calls == []


def test_without_triton_the_kernels_are_not_available_and_the_module_is_torchs(monkeypatch):
    """A torch build without Triton: importing it fails, so the model takes torch's layers, also
    under TRITON_INTERPRET=1."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "fasttrain.pool_triton", raising=False)
    monkeypatch.delattr(fasttrain, "pool_triton", raising=False)
    pool_kernel._kernels.cache_clear()
    try:
        assert not pool_kernel.available() and not pool_kernel.enabled(torch.zeros(1))
        pool = fused_max_pools(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2)), "toy")[1]
        assert not pool.kernels
        x = torch.randn(2, 4, 9, 9)
        assert torch.equal(pool(x), F.max_pool2d(F.relu(x), 3, 2))
    finally:
        pool_kernel._kernels.cache_clear()


def test_pools_the_kernels_do_not_compute_stay_torchs():
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, dilation=2), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(3, 2, return_indices=True), torch.nn.ReLU(),
                              torch.nn.MaxPool2d((3, 2)), torch.nn.ReLU(), torch.nn.MaxPool2d(3),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, ceil_mode=True))
    fused = fused_max_pools(seq, "toy")
    assert [type(m).__name__ for m in fused] == ["ReLU", "MaxPool2d"] * 3 + ["Identity", "FusedReluMaxPool2d"] * 2
    assert (fused[7].kernel_size, fused[7].stride, fused[7].padding) == (3, 3, 0)  # stride None: the window's
    assert fused[9].ceil_mode


def test_fused_max_pool_refuses_a_model_without_relu_into_max_pooling_in_one_line():
    with pytest.raises(FasttrainError, match=r"train.fused_max_pool: true needs a model whose ReLU feeds a MaxPool2d "
                                             r"\(square, dilation 1\) in an nn.Sequential, which toy is "
                                             r"not: set it to false") as e:
        fused_max_pools(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU()), "toy")
    assert "\n" not in str(e.value)


@pytest.mark.gpu
def test_fused_alexnet_on_the_gpu_in_bf16_compiled():
    """The recipe's way: bf16 autocast, channels_last, torch.compile, deterministic cuDNN: the fused
    net's logits and parameter gradients equal the plain compiled net's bit for bit."""
    plain, fused = _alexnets(device="cuda")
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        x = _grid_input((64, 3, 227, 227), torch.float32, True)
        results = []
        for net in (plain, fused):
            step = torch.compile(net)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = step(x)
            out.backward(torch.ones_like(out) / out.numel())
            results.append((out.detach(), [p.grad for p in net.parameters()]))
        (out, grads), (out_fused, grads_fused) = results
        assert torch.equal(out_fused, out)
        for (key, _), g, g_fused in zip(plain.named_parameters(), grads, grads_fused, strict=True):
            assert torch.equal(g_fused, g), key
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.mark.skipif(RUNS_KERNEL, reason="the kernel tests above run in this process")
def test_kernels_under_the_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", __file__],
                       env=env, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"{len(CASES) + 9} passed, 1 skipped" in r.stdout, r.stdout[-2000:]  # only this test skipped there
