"""fasttrain.clock: a phase's seconds add up over its entries, and each entry gives its own."""

import time

import pytest

from fasttrain import clock


def test_each_entry_of_a_phase_gives_its_own_seconds_and_the_phase_their_sum():
    clock.begin()
    with clock.phase("eval") as first:
        sum(range(10_000))
    with clock.phase("eval") as second:
        sum(range(100_000))
    assert first.seconds > 0 and second.seconds > 0
    assert clock.seconds("eval") == first.seconds + second.seconds
    report = clock.report()
    assert report["eval"] == round(first.seconds + second.seconds, 3)
    assert sum(v for k, v in report.items() if k != "total") == pytest.approx(report["total"], abs=5e-3)


def test_named_phases_are_reported_in_their_order_at_zero_when_never_entered():
    clock.begin()
    with clock.phase("train"):
        time.sleep(0.01)
    report = clock.report(("start_up", "train", "checkpoints"))
    assert list(report) == ["start_up", "train", "checkpoints", "other", "total"]
    assert report["checkpoints"] == 0.0 and report["train"] > 0
    assert "checkpoints" not in clock.report()
