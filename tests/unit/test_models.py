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
    relu_after_pools,
    SeparableMaxPool2d,
    SpaceToDepthConv2d,
    separable_max_pools,
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


# --- train.separable_max_pool ---------------------------------------------------------------------

@pytest.mark.parametrize("kernel,stride,padding,ceil_mode", [(3, 2, 0, False), (3, 2, 1, False), (2, 2, 0, False),
                                                             (3, 2, 0, True), (3, 1, 1, False)])
def test_separable_max_pool_takes_the_same_maximum_and_gives_its_gradient_to_the_same_pixel(kernel, stride, padding,
                                                                                            ceil_mode):
    """Inputs of small integers after a ReLU, so most windows hold ties (zeros and equal values):
    the values are equal exactly, and the gradient lands on the same pixel as torch's pooling picks
    (only a pixel that several windows feed may sum in another order)."""
    torch.manual_seed(0)
    plain = torch.nn.MaxPool2d(kernel, stride, padding, ceil_mode=ceil_mode)
    separable = SeparableMaxPool2d(kernel, stride, padding, ceil_mode=ceil_mode)
    for channels_last in (False, True):
        x = torch.randint(-3, 4, (3, 5, 29, 30), dtype=torch.float64).relu()
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, out_sep = plain(a), separable(b)
        assert torch.equal(out_sep, out)
        g = torch.randn_like(out)
        out.backward(g), out_sep.backward(g)
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12)
        assert torch.equal(b.grad != 0, a.grad != 0)  # the same pixels


def test_separable_max_pools_make_the_same_alexnet():
    torch.manual_seed(0)
    plain = build_model("alexnet", 10).double().eval()
    separable = separable_max_pools(build_model("alexnet", 10), "alexnet").double().eval()
    separable.load_state_dict(plain.state_dict())
    assert sum(isinstance(m, SeparableMaxPool2d) for m in separable.modules()) == 3
    x = torch.rand(2, 3, 227, 227, dtype=torch.float64)
    out, out_sep = plain(x), separable(x)
    torch.testing.assert_close(out_sep, out, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    out.backward(g), out_sep.backward(g)
    for (key, p), q in zip(plain.named_parameters(), separable.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.gpu
def test_separable_max_pool_on_the_gpu_is_torchs_pooling_in_bf16():
    """bf16, channels_last, AlexNet's first pool's shape, values rounded so that windows hold ties:
    the values equal bit for bit; an output gradient of ones gives each pixel the count of windows
    that picked it, exact in bf16, so equal counts mean the same pixels were picked; a random
    gradient then agrees within bf16's rounding: the separable way rounds a partial sum to bf16
    on the way, so a pixel may differ by a few units of 2^-8 of the sum of its windows' |gradients|."""
    torch.manual_seed(0)
    x = (torch.randn(64, 64, 55, 55, device="cuda") * 4).round().relu().to(torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    plain, separable = torch.nn.MaxPool2d(3, 2), SeparableMaxPool2d(3, 2)
    for g in ("ones", "randn"):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, out_sep = plain(a), separable(b)
        assert torch.equal(out_sep, out)
        grad = torch.ones_like(out) if g == "ones" else torch.randn_like(out)
        out.backward(grad), out_sep.backward(grad)
        if g == "ones":
            assert torch.equal(b.grad, a.grad)
        else:
            magnitude = x.float().requires_grad_()
            plain(magnitude).backward(grad.abs().float())  # per pixel: the sum of its windows' |gradients|
            assert ((b.grad.float() - a.grad.float()).abs() <= 2**-6 * magnitude.grad).all()


def test_separable_max_pool_refuses_a_model_without_max_pooling_in_one_line():
    with pytest.raises(FasttrainError, match="train.separable_max_pool: true needs a model with MaxPool2d layers "
                                             r"\(that do not return indices\), which toy is not: set it to false") as e:
        separable_max_pools(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AvgPool2d(2)), "toy")
    assert "\n" not in str(e.value)


# --- train.relu_after_pool ------------------------------------------------------------------------

def _alexnet_pair(*transforms, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    plain = build_model("alexnet", 10).to(device, dtype).eval()  # eval: no dropout, so both nets see the same
    moved = build_model("alexnet", 10)
    for transform in transforms:
        moved = transform(moved, "alexnet")
    moved = moved.to(device, dtype).eval()
    moved.load_state_dict(plain.state_dict())  # strict: the same keys
    return plain, moved


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # (conv1's input needs no gradient)
@pytest.mark.parametrize("separable", [False, True])
def test_relu_after_the_pools_makes_the_same_alexnet_bit_for_bit(separable):
    """max(relu(x)) = relu(max(x)), and the gradient goes to the same pixel or to none: the outputs are
    equal bit for bit, with ties in the pools' windows (inputs rounded to few values, so many windows
    hold equal maxima, positive and zero). With torch's pools so is each gradient that reaches a
    convolution; the separable pools' two passes add a pixel's gradients in another order (last-bit
    differences in float64), and a convolution's backward may sum in another order for another memory
    layout, so there and for the parameters' gradients: equal to float64's rounding."""
    transforms = (separable_max_pools, relu_after_pools) if separable else (relu_after_pools,)
    plain, moved = _alexnet_pair(*transforms, dtype=torch.float64)
    kinds = [type(m).__name__ for m in moved.features]
    assert kinds == ["Conv2d", type(moved.features[1]).__name__, "ReLU"] + kinds[3:]
    assert [i for i, m in enumerate(moved.features) if isinstance(m, torch.nn.MaxPool2d)] == [1, 4, 11]
    assert [i for i, m in enumerate(plain.features) if isinstance(m, torch.nn.MaxPool2d)] == [2, 5, 12]
    torch.manual_seed(1)
    x = (torch.randn(4, 3, 227, 227, dtype=torch.float64) * 2).round() / 2
    seen = {}  # the gradient reaching each convolution's output
    for name, net in (("plain", plain), ("moved", moved)):
        for m in net.modules():
            if isinstance(m, torch.nn.ReLU):
                m.inplace = False  # (the same function; a backward hook cannot see past an in-place op)
        for i in (0, 3, 10):
            net.features[i].register_full_backward_hook(
                lambda m, gi, go, key=(name, i): seen.__setitem__(key, go[0].clone()))
    out, out_moved = plain(x), moved(x)
    assert torch.equal(out_moved, out)
    g = torch.randn_like(out)
    out.backward(g), out_moved.backward(g)
    for i in (0, 3, 10):
        if separable:
            torch.testing.assert_close(seen["moved", i], seen["plain", i], rtol=1e-12, atol=1e-15, msg=str(i))
        else:
            assert torch.equal(seen["moved", i], seen["plain", i]), i
        assert (seen["plain", i] == 0).float().mean() > 0.5, i  # most of it is zero: ReLU and the pools' choices
    for (key, p), q in zip(plain.named_parameters(), moved.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=key)


def test_relu_after_the_pools_loads_into_a_bare_torchvision_alexnet():
    _, moved = _alexnet_pair(relu_after_pools)
    bare = torchvision.models.alexnet(num_classes=10)
    bare.load_state_dict(moved.state_dict())  # strict
    x = torch.rand(2, 3, 227, 227)
    torch.testing.assert_close(moved(x), bare.eval()(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_relu_after_the_pools_on_the_gpu_in_bf16():
    """bf16 autocast, channels_last, the recipe's separable pools, deterministic cuDNN: the outputs
    equal bit for bit; the parameters' gradients agree within bf16's rounding (a convolution's backward
    may pick another algorithm for another layout of the same gradient)."""
    plain, moved = _alexnet_pair(separable_max_pools, dtype=torch.float32, device="cuda")
    moved = relu_after_pools(moved, "alexnet")
    plain, moved = (m.to(memory_format=torch.channels_last) for m in (plain, moved))
    torch.manual_seed(1)
    x = torch.randn(32, 3, 227, 227, device="cuda").contiguous(memory_format=torch.channels_last)
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, out_moved = plain(x), moved(x)
        assert torch.equal(out_moved, out)
        g = torch.randn_like(out)
        out.backward(g), out_moved.backward(g)
        for (key, p), q in zip(plain.named_parameters(), moved.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, rtol=2e-2, atol=2e-2 * p.grad.abs().max().item(), msg=key)
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_relu_after_pool_refuses_a_model_without_relu_into_max_pooling_in_one_line():
    with pytest.raises(FasttrainError, match=r"train.relu_after_pool: true needs a model whose ReLU feeds a "
                                             r"MaxPool2d in an nn.Sequential, which toy is not: set it to false") as e:
        relu_after_pools(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU()), "toy")
    assert "\n" not in str(e.value)
