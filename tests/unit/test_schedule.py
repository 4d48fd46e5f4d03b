"""train.scheduler onecycle and train.cycle_momentum: the lr and beta1 the optimizer holds, step by step,
against torch's OneCycleLR defaults worked out by hand (peak at 30% of the steps, from max_lr / 25)."""

import math

import pytest
import torch

from fasttrain import config
from fasttrain.train import make_scheduler

STEPS = 20  # 2 epochs of 10 steps: the lr rises over steps 0..5 (0.3 * 20 - 1 = 5), then falls


def _schedule(cycle_momentum: bool, lr):
    cfg = config.from_dict({"train": {"scheduler": "onecycle", "cycle_momentum": cycle_momentum, "lr": 1e-3,
                                      "epochs": 2, "adam_beta2": 0.99}}).train
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=lr, betas=(0.9, 0.99))
    scheduler = make_scheduler(cfg, optimizer, steps_per_epoch=10)
    lrs, betas = [], []
    for _ in range(STEPS):
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        betas.append(tuple(optimizer.param_groups[0]["betas"]))
        scheduler.step()
    return optimizer, lrs, betas


def _cos(start, end, pct):  # torch's cosine annealing from start to end, pct of the way
    return end + (start - end) / 2 * (1 + math.cos(math.pi * pct))


pytestmark = pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_onecycle_without_momentum_cycling_keeps_beta1_and_moves_the_lr(tensor_lr):
    """cycle_momentum false: beta1 stays at 0.9 every step (so a CUDA graph may replay the fused
    AdamW); the lr follows the one-cycle curve, written into the lr tensor in place when it is one
    (as a graphed run's is: the graphs read that tensor)."""
    lr = torch.tensor(1e-3) if tensor_lr else 1e-3
    optimizer, lrs, betas = _schedule(False, lr)
    assert betas == [(0.9, 0.99)] * STEPS
    assert lrs[0] == pytest.approx(1e-3 / 25)
    assert lrs[3] == pytest.approx(_cos(1e-3 / 25, 1e-3, 3 / 5))
    assert lrs[5] == pytest.approx(1e-3) and max(lrs) == pytest.approx(1e-3)
    assert lrs[12] == pytest.approx(_cos(1e-3, 1e-3 / 25 / 1e4, 7 / 14))
    if tensor_lr:
        assert optimizer.param_groups[0]["lr"] is lr


def test_onecycle_cycles_beta1_against_the_lr_by_default():
    """The default (torch's): beta1 from 0.95 down to 0.85 at the peak lr, then back up to 0.95."""
    _, lrs, betas = _schedule(True, 1e-3)
    beta1 = [b[0] for b in betas]
    assert {b[1] for b in betas} == {0.99}
    assert beta1[0] == pytest.approx(0.95) and beta1[5] == pytest.approx(0.85) and min(beta1) == pytest.approx(0.85)
    assert beta1[12] == pytest.approx(_cos(0.85, 0.95, 7 / 14))
    assert lrs[5] == pytest.approx(1e-3)
