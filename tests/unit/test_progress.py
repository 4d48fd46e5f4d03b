"""Progress: plain periodic lines when stderr is not a terminal, the loss read only when one is due."""

import io

from fasttrain.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Loss:
    """Stands in for a device tensor: counts the host reads that would wait for the GPU."""

    def __init__(self, value: float):
        self.value, self.reads = value, 0

    def __float__(self) -> float:
        self.reads += 1
        return self.value


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_not_a_bar_when_the_stream_is_not_a_terminal():
    out, clock, loss = io.StringIO(), Clock(), Loss(1.25)
    progress = Progress("single-amp", epochs=3, steps_per_epoch=100, stream=out, line_seconds=10, clock=clock)
    progress.start_epoch(1)
    for _ in range(100):
        clock.now += 0.25  # 100 steps of 64 images over 25 s: a line at 10 s and at 20 s
        progress.step(64, loss)
    progress.end_epoch()

    lines = out.getvalue().splitlines()
    assert lines == [
        "single-amp: epoch 2/3  step 40/100  loss 1.2500  256 img/s  10 s",
        "single-amp: epoch 2/3  step 80/100  loss 1.2500  256 img/s  20 s",
    ]
    assert "\r" not in out.getvalue()
    assert loss.reads == 2  # not once per step


def test_nothing_from_a_process_that_is_not_the_main_one():
    out, clock, loss = Terminal(), Clock(), Loss(2.0)
    progress = Progress("ddp-fp32", epochs=1, steps_per_epoch=10, enabled=False, stream=out, clock=clock)
    progress.start_epoch(0)
    for _ in range(10):
        clock.now += 60
        progress.step(32, loss)
    progress.end_epoch()
    assert out.getvalue() == "" and loss.reads == 0


def test_a_bar_with_epoch_steps_loss_and_speed_on_a_terminal():
    out, clock, loss = Terminal(), Clock(), Loss(0.5)
    progress = Progress("single-bf16", epochs=2, steps_per_epoch=4, stream=out, refresh_seconds=1, clock=clock)
    progress.start_epoch(0)
    for _ in range(4):
        clock.now += 0.6
        progress.step(10, loss)
    progress.end_epoch()
    text = out.getvalue()
    assert "single-bf16 epoch 1/2" in text and "loss 0.5000" in text and "img/s" in text
    assert "\r" in text  # drawn in place, then cleared at the end of the epoch
    assert loss.reads == 2
