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
