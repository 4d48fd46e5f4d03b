import pytest
import torch
import torchvision

from fasttrain import parallel
from fasttrain.errors import FasttrainError
from fasttrain.models import (
    PADDED_CHANNELS,
    ChannelPaddedConv2d,
    build_model,
    check_img_size,
    first_conv,
    min_img_size,
    pad_first_conv,
)
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


def test_padded_first_conv_computes_the_same_convolution_and_weight_gradient():
    """train.pad_channels: input with zero channels appended, weight padded inside the forward."""
    torch.manual_seed(0)
    plain = build_model("alexnet", 10)
    padded = pad_first_conv(build_model("alexnet", 10), "alexnet")
    padded.load_state_dict(plain.state_dict())  # the same parameters, the same keys and shapes
    assert isinstance(padded.features[0], ChannelPaddedConv2d) and padded.features[0].weight.shape == (64, 3, 11, 11)
    plain.eval()  # no dropout: the two forwards must match
    padded.eval()
    x = torch.rand(2, 3, 70, 70)
    x8 = torch.cat([x, torch.zeros(2, PADDED_CHANNELS - 3, 70, 70)], 1)
    out, out8 = plain(x), padded(x8)
    torch.testing.assert_close(out8, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded(x), out, rtol=0, atol=0)  # 3 channels: the plain convolution
    out.sum().backward()
    out8.sum().backward()
    for (name, p), q in zip(plain.named_parameters(), padded.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    bare = torchvision.models.alexnet(num_classes=10)
    bare.load_state_dict(padded.state_dict(), strict=True)  # checkpoints stay plain AlexNet ones


@pytest.mark.parametrize("model", [
    torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)),  # no convolution at all
    torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3)),  # a first convolution that is not on 3 channels
    torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, groups=3)),  # grouped: padding would change the groups
])
def test_pad_channels_refuses_a_model_it_cannot_pad_in_one_line(model):
    with pytest.raises(FasttrainError, match="train.pad_channels: true needs a model whose first layer is a "
                                             "3-channel Conv2d, which toy is not: set it to false") as e:
        first_conv(model, "toy")
    assert "\n" not in str(e.value)
