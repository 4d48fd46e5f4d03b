"""`fasttrain bench`'s FLOPs per image, the numerator of its model FLOP utilisation, against a count
by hand: torch's FlopCounterMode there, the layers' shapes here."""

from fasttrain.bench import flops_per_image

# torchvision's AlexNet at 227 px, 10 classes: (input channels, output channels, kernel side, output
# side) of each convolution, (inputs, outputs) of each linear layer.
CONVS = [(3, 64, 11, 56), (64, 192, 5, 27), (192, 384, 3, 13), (384, 256, 3, 13), (256, 256, 3, 13)]
LINEARS = [(256 * 6 * 6, 4096), (4096, 4096), (4096, 10)]


def test_alexnet_flops_per_image_are_its_multiply_adds_counted_by_hand():
    """A multiply-add is 2 FLOPs. The backward pass costs twice the forward (the gradient of each
    layer's input and of its weight), except that the first convolution's input, the image, needs
    no gradient: 3 x forward - 1 x conv1 = 3 x 1.4254 - 0.1457 = 4.1306 GFLOP."""
    conv_macs = [cin * cout * k * k * side * side for cin, cout, k, side in CONVS]
    linear_macs = [n_in * n_out for n_in, n_out in LINEARS]
    forward = 2 * (sum(conv_macs) + sum(linear_macs))
    assert forward == 1_425_424_384
    assert flops_per_image("alexnet", 227, 10) == 3 * forward - 2 * conv_macs[0] == 4_130_562_048
