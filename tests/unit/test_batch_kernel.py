"""The fused gpu-loader kernel against the tensor-op chain it replaces.

On a machine without a GPU the kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set in
a child pytest, since Triton reads it when the kernel is defined); with a GPU it runs for real.
"""

import os
import subprocess
import sys

import pytest
import torch

from fasttrain import batch_kernel
from fasttrain.loaders import (CROP_PADDING_PX, crop_flip, make_eval_loader,
                               make_train_loader, to_float_resized)

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RUNS_KERNEL = torch.cuda.is_available() or INTERPRETED
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_kernel = pytest.mark.skipif(not RUNS_KERNEL, reason="needs CUDA or TRITON_INTERPRET=1")

CASES = [  # augment, channels_last, dtype, img_size, (h, w)
    (True, True, torch.bfloat16, 97, (32, 32)),
    (True, False, torch.float32, 41, (32, 32)),
    (False, True, torch.float16, 19, (8, 12)),  # non-square source
    (False, False, torch.float32, 8, (8, 8)),  # no resize: values exactly x / 255
    (True, True, torch.float32, 5, (16, 16)),  # downsampling
] + ([(True, True, torch.bfloat16, 227, (32, 32))] if torch.cuda.is_available() else [])  # the real size



def _reference(images, idx, aug, img_size, channels_last, dtype):
    x = images.index_select(0, idx)
    if aug is not None:
        x = crop_flip(x, aug[0], aug[1], aug[2])
    return to_float_resized(x, img_size, channels_last, dtype)


def _ulp(dtype):
    return 0.0 if dtype == torch.float32 else torch.finfo(dtype).eps  # one step at values in [1, 2)


@needs_kernel
@pytest.mark.parametrize("augment, channels_last, dtype, img_size, hw", CASES)
def test_fused_matches_the_tensor_op_chain(augment, channels_last, dtype, img_size, hw):
    g = torch.Generator().manual_seed(img_size)
    n = 7
    images = torch.randint(0, 256, (n, 3, *hw), dtype=torch.uint8, generator=g).to(DEVICE)
    k = 2 * (2 * CROP_PADDING_PX + 1)  # every crop row and column offset, flipped and not
    idx = torch.arange(k, device=DEVICE) % n  # images repeat
    offsets = torch.arange(k, device=DEVICE) % (2 * CROP_PADDING_PX + 1)
    aug = torch.stack([offsets, offsets.flip(0), torch.arange(k, device=DEVICE) % 2])
    aug = aug if augment else None

    out = batch_kernel.gather_crop_flip_resize(images, idx, aug, img_size, channels_last, dtype,
                                               CROP_PADDING_PX)
    ref = _reference(images, idx, aug, img_size, channels_last, dtype)

    assert out.shape == ref.shape == (idx.shape[0], 3, img_size, img_size)
    assert out.dtype == dtype
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)
    # float32: the same formula, summed in another order; low precision: one rounding apart at most
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=1e-6 + _ulp(dtype))
    if hw == (img_size, img_size) and not augment:
        assert torch.equal(out, images[idx].float() / 255)


@needs_kernel
def test_int64_pixel_indices_give_the_same_batch(monkeypatch):
    """The WIDE path (over 2**31 output pixels, ~13 GB in bf16) on a small batch."""
    images = torch.randint(0, 256, (5, 3, 12, 12), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(1)).to(DEVICE)
    idx = torch.tensor([4, 0, 2], device=DEVICE)
    aug = torch.tensor([[0, 8, 3], [8, 1, 4], [1, 0, 1]], device=DEVICE)
    narrow = batch_kernel.gather_crop_flip_resize(images, idx, aug, 17, True, torch.float32, CROP_PADDING_PX)
    monkeypatch.setattr(batch_kernel, "INT32_PIXELS", 0)
    wide = batch_kernel.gather_crop_flip_resize(images, idx, aug, 17, True, torch.float32, CROP_PADDING_PX)
    assert torch.equal(wide, narrow)
    torch.testing.assert_close(wide, _reference(images, idx, aug, 17, True, torch.float32), rtol=0, atol=1e-6)


@needs_kernel
def test_loader_batches_with_and_without_the_kernel_agree(monkeypatch):
    images = torch.randint(0, 256, (29, 3, 10, 10), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    labels = torch.arange(29) % 10

    def batches(fused, train):
        monkeypatch.setenv(batch_kernel.DISABLE_ENV, "1" if fused else "0")
        kw = dict(batch_size=8, img_size=15, device=DEVICE, channels_last=True,
                  dtype=torch.float32)
        if train:
            loader = make_train_loader("gpu", images, labels, augment=True, seed=3, **kw)
            loader.set_epoch(2)
        else:
            loader = make_eval_loader("gpu", images, labels, **kw)
        assert loader.fused == fused
        return list(loader)

    for train in (True, False):
        fused, plain = batches(True, train), batches(False, train)
        assert [y.shape[0] for _, y in fused] == [8, 8, 8, 5]
        for (x, y), (ref_x, ref_y) in zip(fused, plain, strict=True):
            assert torch.equal(y, ref_y)
            torch.testing.assert_close(x, ref_x, rtol=0, atol=1e-6)


def test_kernel_is_off_for_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not batch_kernel.enabled(torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    if torch.cuda.is_available():
        cuda = torch.zeros(1, 3, 4, 4, dtype=torch.uint8, device="cuda")
        assert batch_kernel.enabled(cuda)
        monkeypatch.setenv(batch_kernel.DISABLE_ENV, "0")
        assert not batch_kernel.enabled(cuda)


@pytest.mark.skipif(RUNS_KERNEL, reason="the kernel tests above run in this process")
def test_kernel_under_the_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                        "-k", "fused_matches or with_and_without"], env=env, text=True,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"{len(CASES) + 1} passed" in r.stdout, r.stdout[-2000:]
