import pytest
import torch
from torch import nn

from fasttrain.precision import PRECISIONS, AutocastForward

EXPECTED = {  # the table the product promises: autocast dtype, GradScaler
    "fp32": (None, False),
    "autocast": (torch.float16, False),
    "amp": (torch.float16, True),
    "bf16": (torch.bfloat16, False),
}


def test_table_is_exactly_the_four_variants():
    assert {n: (p.autocast_dtype, p.grad_scaler) for n, p in PRECISIONS.items()} == EXPECTED


@pytest.mark.parametrize("name", list(EXPECTED))
def test_layers_run_in_the_configured_dtype(name):
    """A forward hook on every Linear/Conv sees the variant's compute dtype (CPU autocast)."""
    precision = PRECISIONS[name]
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    seen = []
    for layer in model:
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = AutocastForward(model, precision)(torch.randn(2, 3, 8, 8))
    assert seen == [precision.compute_dtype] * 2
    assert out.dtype == precision.compute_dtype


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scaler_is_enabled_only_for_amp(name):
    scaler = PRECISIONS[name].scaler("cpu")
    assert scaler.is_enabled() == (name == "amp")
    loss = torch.tensor(2.0, requires_grad=True)
    assert float(scaler.scale(loss).detach()) == (2.0 * 65536.0 if name == "amp" else 2.0)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("device_ids", [[0, 0], pytest.param([0, 1], marks=pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 GPUs"))])
def test_dataparallel_replicas_run_in_the_configured_dtype(name, device_ids):
    """DataParallel runs its replicas in worker threads, one per entry of device_ids ([0, 0]: two
    on one GPU). Plain bf16 autocast around DataParallel lets them fall back to fp16;
    AutocastForward must not."""
    precision = PRECISIONS[name]
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).cuda()
    seen = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    dp = nn.DataParallel(AutocastForward(model, precision), device_ids=device_ids)
    with precision.autocast("cuda"):
        dp(torch.randn(4, 8, device="cuda"))
    assert len(seen) == 4 and set(seen) == {precision.compute_dtype}


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_gpu_without_bf16_hardware_says_so_and_what_to_use(monkeypatch, native):
    """A V100 (compute capability 7.0) as torch describes it: bf16 tensors work, native bf16 does not."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0) if native else (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    gpu = torch.device("cuda", 0)
    said = PRECISIONS["bf16"].not_native_on(gpu)
    if native:
        assert said is None
    else:
        assert said == ("precision bf16: Tesla V100-SXM2-32GB (compute capability 7.0) has no bf16 hardware, which "
                        "needs 8.0: torch emulates bf16 products in fp32, slower than fp32, and cuDNN may refuse bf16 "
                        "convolutions; this GPU's half precision is fp16 (autocast, amp)")
    assert all(PRECISIONS[name].not_native_on(gpu) is None for name in ("fp32", "autocast", "amp"))
    assert PRECISIONS["bf16"].not_native_on(torch.device("cpu")) is None  # the CPU's own warnings say how it runs
