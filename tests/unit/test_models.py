import pytest
import torch
import torchvision

from fasttrain import parallel
from fasttrain.errors import FasttrainError
from fasttrain.models import build_model, check_img_size, min_img_size
from fasttrain.precision import PRECISIONS, AutocastForward


def test_alexnet_needs_63_pixels():
    assert min_img_size("alexnet") == 63
    check_img_size("alexnet", 63)
    with pytest.raises(FasttrainError, match="at least 63"):
        check_img_size("alexnet", 62)


def test_unknown_model_is_a_one_line_error():
    with pytest.raises(FasttrainError, match="unknown model.name 'alexnett'") as e:
        build_model("alexnett", 10)
    assert "\n" not in str(e.value)


def test_builder_does_not_fix_dtype_or_device():
    m = build_model("squeezenet1_1", 7)
    p = next(m.parameters())
    assert p.dtype == torch.float32 and p.device.type == "cpu"
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 7)


def test_unwrap_strips_every_wrapper_and_keys_load_into_a_bare_model():
    raw = build_model("alexnet", 10)
    wrapped = torch.nn.DataParallel(AutocastForward(raw, PRECISIONS["bf16"]))
    assert parallel.unwrap(wrapped) is raw
    bare = torchvision.models.alexnet(num_classes=10)
    bare.load_state_dict(parallel.unwrap(wrapped).state_dict(), strict=True)
