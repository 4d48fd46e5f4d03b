import pytest
import torch
import torchvision

from fasttrain import parallel
from fasttrain.errors import FasttrainError
from fasttrain.models import (
    build_model,
    check_img_size,
    first_conv,
    min_img_size,
    SpaceToDepthConv2d,
    space_to_depth,
    space_to_depth_first_conv,
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


OWN = """\
import torch
from torch import nn


def tiny(num_classes):
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def not_a_model(num_classes):
    return [num_classes]
"""


def test_your_own_model_from_a_file_of_the_repository_or_a_module(tmp_path, monkeypatch):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "own.py").write_text(OWN)
    monkeypatch.chdir(tmp_path)  # where the stages run: the repository
    model = build_model("nets/own.py:tiny", 7)
    assert model(torch.zeros(2, 3, 16, 16)).shape == (2, 7)
    assert min_img_size("nets/own.py:tiny") == 3  # the shape probe takes it like any other
    monkeypatch.syspath_prepend(str(tmp_path / "nets"))
    assert build_model("own:tiny", 4)[-1].out_features == 4  # an importable module


@pytest.mark.parametrize("name, message", [
    ("nets/none.py:tiny", "model.name 'nets/none.py:tiny': no file nets/none.py (a path relative to the repository)"),
    ("nets/own.py:tinny", "model.name 'nets/own.py:tinny': nets/own.py has no function tinny (it has: not_a_model, "
                          "tiny)"),
    ("nets/own.py:not_a_model", "model.name 'nets/own.py:not_a_model': not_a_model(num_classes=10) returned a list, "
                                "not a torch.nn.Module"),
    ("nets/broken.py:tiny", "model.name 'nets/broken.py:tiny': importing nets/broken.py failed: NameError: name "
                            "'undefined' is not defined"),
    ("no_such_module:tiny", "model.name 'no_such_module:tiny': importing no_such_module failed: ModuleNotFoundError: "
                            "No module named 'no_such_module'"),
])
def test_your_own_model_that_cannot_be_built_is_one_line_naming_it(tmp_path, monkeypatch, name, message):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "own.py").write_text(OWN)
    (tmp_path / "nets" / "broken.py").write_text("undefined\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FasttrainError) as e:
        build_model(name, 10)
    assert str(e.value) == message


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


@pytest.mark.parametrize("model", [
    torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)),  # no convolution at all
    torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3)),  # a first convolution that is not on 3 channels
    torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, groups=3)),  # grouped: padding would change the groups
])
def test_space_to_depth_refuses_a_model_without_a_3_channel_first_conv_in_one_line(model):
    with pytest.raises(FasttrainError, match="train.space_to_depth: true needs a model whose first layer is a "
                                             "3-channel Conv2d, which toy is not: set it to false") as e:
        first_conv(model, "toy")
    assert "\n" not in str(e.value)


# --- train.space_to_depth -------------------------------------------------------------------------

def _plain_and_space_to_depth(name: str, dtype=torch.float64, device="cpu"):
    torch.manual_seed(0)
    plain = build_model(name, 10).to(device, dtype).eval()  # eval: no dropout, the two forwards must match
    s2d = space_to_depth_first_conv(build_model(name, 10), name).to(device, dtype).eval()
    s2d.load_state_dict(plain.state_dict())  # the same parameters, the same keys and shapes
    return plain, s2d


def test_space_to_depth_tiles_pixels_into_channels():
    """A hand-made 4x4 image of 2 channels in 2x2 tiles: each output pixel holds its tile's values,
    ordered (row in the tile, column in the tile, channel)."""
    x = torch.arange(32.).reshape(1, 2, 4, 4)  # channel 0: 0..15, channel 1: 16..31
    y = space_to_depth(x, 2)
    assert y.shape == (1, 8, 2, 2)
    assert y[0, :, 0, 0].tolist() == [0, 16, 1, 17, 4, 20, 5, 21]  # top-left tile: rows 0-1, columns 0-1
    assert y[0, :, 1, 1].tolist() == [10, 26, 11, 27, 14, 30, 15, 31]
    assert space_to_depth(x.contiguous(memory_format=torch.channels_last), 2).is_contiguous(
        memory_format=torch.channels_last)


@pytest.mark.parametrize("kernel,stride,padding,size", [
    (11, 4, 2, 227), (11, 4, 2, 224), (11, 4, 2, 160), (11, 4, 2, 70), (11, 4, 2, 63),  # AlexNet's first conv
    (7, 2, 3, 64), (7, 2, 3, 33), (3, 2, 0, 32),  # resnet's, squeezenet's
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_space_to_depth_conv_is_the_plain_convolution_in_float64(kernel, stride, padding, size, channels_last):
    """At sizes whose padding after the image is added, exact and cut: the output and the weight,
    bias and input gradients as the plain convolution's to float64 rounding."""
    torch.manual_seed(0)
    plain = torch.nn.Conv2d(3, 16, kernel, stride, padding).double()
    s2d = torch.nn.Conv2d(3, 16, kernel, stride, padding).double()
    s2d.load_state_dict(plain.state_dict())
    s2d.__class__ = SpaceToDepthConv2d
    x = torch.rand(2, 3, size, size, dtype=torch.float64)
    if channels_last:
        plain, s2d = plain.to(memory_format=torch.channels_last), s2d.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, out_s2d = plain(a), s2d(b)
    torch.testing.assert_close(out_s2d, out, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)  # a loss whose gradient differs per output
    (out * weights).sum().backward()
    (out_s2d * weights).sum().backward()
    for got, want in ((s2d.weight.grad, plain.weight.grad), (s2d.bias.grad, plain.bias.grad), (b.grad, a.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_space_to_depth_alexnet_is_the_plain_alexnet_and_loads_into_a_bare_one():
    """The whole model at 227 px, channels_last: outputs and every parameter's gradient as the plain
    model's, and the checkpoint is a bare torchvision AlexNet's."""
    plain, s2d = _plain_and_space_to_depth("alexnet")
    assert isinstance(s2d.features[0], SpaceToDepthConv2d)
    plain, s2d = plain.to(memory_format=torch.channels_last), s2d.to(memory_format=torch.channels_last)
    x = torch.rand(2, 3, 227, 227, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    out, out_s2d = plain(x), s2d(x)
    torch.testing.assert_close(out_s2d, out, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (out_s2d * weights).sum().backward()
    for (key, p), q in zip(plain.named_parameters(), s2d.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=key)
    bare = torchvision.models.alexnet(num_classes=10)
    bare.load_state_dict(s2d.state_dict(), strict=True)  # checkpoints stay plain torchvision ones


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_space_to_depth_first_conv_on_the_gpu_matches_the_plain_one(dtype):
    """On cuDNN, channels_last, under autocast as training runs it: the first conv's output and
    weight gradient as the plain layer's within the precision's rounding (sums in another order)."""
    torch.manual_seed(0)
    plain = torch.nn.Conv2d(3, 64, 11, 4, 2).cuda().to(memory_format=torch.channels_last)
    s2d = torch.nn.Conv2d(3, 64, 11, 4, 2).cuda().to(memory_format=torch.channels_last)
    s2d.load_state_dict(plain.state_dict())
    s2d.__class__ = SpaceToDepthConv2d
    x = torch.rand(64, 3, 227, 227, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32), \
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # float32 as float32, not TF32
        out, out_s2d = plain(x), s2d(x)
        tol = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}[dtype]
        scale = out.float().abs().max().item()
        assert (out_s2d.float() - out.float()).abs().max().item() <= tol * scale
        g = torch.randn_like(out)
        out.backward(g), out_s2d.backward(g)
    grad_scale = plain.weight.grad.float().abs().max().item()
    assert (s2d.weight.grad.float() - plain.weight.grad.float()).abs().max().item() <= tol * grad_scale
    assert (s2d.bias.grad.float() - plain.bias.grad.float()).abs().max().item() <= tol * plain.bias.grad.abs().max().item()


@pytest.mark.parametrize("model,reason", [
    (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=1)), "stride (1, 1)"),  # nothing to tile
    (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=(2, 1))), "stride (2, 1)"),
    (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, dilation=2)), "stride (2, 2)"),
    (torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, padding_mode="reflect")), "stride (2, 2)"),
])
def test_space_to_depth_refuses_a_first_conv_it_cannot_tile_in_one_line(model, reason):
    with pytest.raises(FasttrainError, match=r"train.space_to_depth: true needs a first convolution with a square "
                                             r"kernel, one stride > 1 and plain zero padding, which toy's .*"
                                             + reason.replace("(", r"\(").replace(")", r"\)")) as e:
        space_to_depth_first_conv(model, "toy")
    assert "\n" not in str(e.value)
    with pytest.raises(FasttrainError, match="train.space_to_depth: true needs a model whose first layer is a 3-channel"):
        space_to_depth_first_conv(torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, stride=2)), "toy")
