"""Precision is a table, not branches: each variant is an autocast dtype (or none) and a scaler switch.

The training loop always enters `autocast(...)` and always calls the GradScaler; the entry decides
whether either does anything, so every variant runs through one code path.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from fasttrain.layout import PRECISION_NAMES


@dataclass(frozen=True)
class Precision:
    name: str
    autocast_dtype: torch.dtype | None  # None: no autocast, everything in fp32
    grad_scaler: bool  # loss scaling against fp16 gradient underflow

    def autocast(self, device_type: str) -> AbstractContextManager:
        return torch.amp.autocast(device_type, dtype=self.autocast_dtype or torch.float32,
                                  enabled=self.autocast_dtype is not None)

    def scaler(self, device_type: str) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(device_type, enabled=self.grad_scaler)

    def not_native_on(self, device: torch.device) -> str | None:
        """Why this precision's figures on `device` are not what it buys where the hardware has it,
        or None. A GPU below compute capability 8.0 (V100, T4, RTX 20xx) has no bf16 units: torch
        computes bf16 matrix products in fp32 there, slower than fp32 itself, and cuDNN has no bf16
        convolutions for it, so a bf16 run is slow or stops at its first convolution."""
        if self.autocast_dtype is not torch.bfloat16 or device.type != "cuda":
            return None
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        major, minor = torch.cuda.get_device_capability(device)
        return (f"precision bf16: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no "
                f"bf16 hardware, which needs 8.0: torch emulates bf16 products in fp32, slower than fp32, and cuDNN "
                f"may refuse bf16 convolutions; this GPU's half precision is fp16 (autocast, amp)")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype autocast runs matrix products and convolutions in."""
        return self.autocast_dtype or torch.float32


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", None, False),
        Precision("autocast", torch.float16, False),  # fp16 autocast without a scaler: the tempting shortcut
        Precision("amp", torch.float16, True),  # fp16 autocast + GradScaler: the documented recipe
        Precision("bf16", torch.bfloat16, False),  # bf16 has fp32's range, so no scaler is needed
    )
}

assert tuple(PRECISIONS) == PRECISION_NAMES


class AutocastForward(torch.nn.Module):
    """Enters the variant's autocast inside forward().

    Autocast state is thread-local: nn.DataParallel runs each replica's forward in its own thread,
    which would otherwise run in fp32, or under its own default dtype (fp16) whatever bf16 the caller
    asked for. Entering it here makes every replica run in the configured dtype.
    """

    def __init__(self, module: torch.nn.Module, precision: Precision):
        super().__init__()
        self.module = module
        self.precision = precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast(x.device.type):
            return self.module(x)
