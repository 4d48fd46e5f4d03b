"""What compare's speed interval is computed from: report.speed_samples."""

from fasttrain.report import speed_samples
from fasttrain.saved import EpochRecord


def _epoch(n: int, seconds: float, windows: list[float], img_size: int = 227) -> EpochRecord:
    return EpochRecord(n, seconds, 1.0, 0.5, 1e-4, 1000, img_size, window_images_per_second=windows)


def test_three_steady_epochs_or_more_are_the_samples_and_the_first_epoch_is_left_out():
    history = [_epoch(1, 10.0, [1.0]), _epoch(2, 2.0, [9.0]), _epoch(3, 4.0, [9.0]), _epoch(4, 5.0, [9.0])]
    assert speed_samples(history, 227) == {"kind": "epochs", "images_per_second": [500.0, 250.0, 200.0]}


def test_with_fewer_steady_epochs_their_windows_are_the_samples():
    history = [_epoch(1, 10.0, [1.0, 2.0]), _epoch(2, 2.0, [480.0, 520.0]), _epoch(3, 2.0, [490.0, 510.0])]
    assert speed_samples(history, 227) == {"kind": "windows", "images_per_second": [480.0, 520.0, 490.0, 510.0]}


def test_one_epoch_gives_its_windows_less_the_first_which_carries_the_warm_up():
    history = [_epoch(1, 10.0, [50.0, 480.0, 520.0])]
    assert speed_samples(history, 227) == {"kind": "windows", "images_per_second": [480.0, 520.0]}


def test_under_progressive_resizing_only_epochs_at_the_run_s_resolution_count():
    history = [_epoch(1, 1.0, [1.0], 128), _epoch(2, 1.0, [1.0], 128), _epoch(3, 2.0, [400.0, 600.0]),
               _epoch(4, 4.0, [250.0, 250.0])]
    assert speed_samples(history, 227) == {"kind": "windows", "images_per_second": [400.0, 600.0, 250.0, 250.0]}
