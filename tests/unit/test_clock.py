"""fasttrain.clock: a phase's seconds add up over its entries, and each entry gives its own."""

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
