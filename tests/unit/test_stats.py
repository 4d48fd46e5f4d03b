"""The intervals and verdicts on hand-made cases whose answers are known."""

import math
import random

import pytest

from fasttrain import stats


@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (40, 2.021), (60, 2.000),
                                   (120, 1.980), (1000, 1.962)])
def test_t_quantiles_are_the_tables(df, t):
    assert stats.t_quantile(df) == pytest.approx(t, abs=0.0015)
    assert stats.t_quantile(df + 0.7) == stats.t_quantile(df) or df >= 31  # a fractional df rounds down


def test_the_mean_interval_by_hand():
    # mean 10, sample sd 2 (values 8, 10, 12), t(2) = 4.303: 10 +- 4.303 * 2 / sqrt(3)
    iv = stats.mean_interval([8.0, 10.0, 12.0])
    assert (iv.value, iv.n) == (10.0, 3)
    assert iv.high - iv.value == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert stats.mean_interval([5.0]) is None  # one sample: no spread to measure


def test_two_variants_of_the_same_speed_are_no_different():
    rng = random.Random(0)
    base = [1000 + rng.gauss(0, 15) for _ in range(8)]
    same = [1004 + rng.gauss(0, 15) for _ in range(8)]  # 0.4% faster by its point figure: noise
    speedup = stats.ratio_interval(same, base)
    assert speedup.value > 1 and speedup.holds(1.0)
    assert stats.speed_verdict(speedup) == "no different"
    identical = stats.ratio_interval([500.0, 500.0], [500.0, 500.0])
    assert (identical.low, identical.high) == (1.0, 1.0) and stats.speed_verdict(identical) == "no different"


def test_a_speed_up_of_one_and_a_half_with_tight_epochs_is_faster_and_its_interval_holds_it():
    base = [1000.0, 1003.0, 998.0, 1001.0, 999.0]
    fast = [1500.0, 1497.0, 1502.0, 1499.0, 1501.0]
    speedup = stats.ratio_interval(fast, base)
    assert speedup.value == pytest.approx(1.5, abs=0.001) and speedup.holds(1.5)
    assert speedup.high - speedup.low < 0.01
    assert stats.speed_verdict(speedup) == "faster"
    assert stats.speed_verdict(stats.ratio_interval(base, fast)) == "slower"
    assert stats.ratio_interval([1.0], base) is None and stats.speed_verdict(None) is None


def _results(n: int, right: set[int]) -> str:
    return "".join("1" if i in right else "0" for i in range(n))


def test_an_accuracy_change_smaller_than_its_interval_is_the_same():
    n = 10_000
    base = _results(n, set(range(0, 8000)))  # 80.00%
    # 40 images gained and 20 lost: +0.20 points, but 60 disagreements give an interval of about +-0.15
    other = _results(n, set(range(20, 8040)))
    change = stats.paired_change(base, other)
    assert change.value == pytest.approx(0.20)
    se = math.sqrt((60 / n - 0.002**2) * n / (n - 1) / n)
    assert change.high - change.value == pytest.approx(100 * stats.Z * se)
    assert stats.accuracy_verdict(change) == "higher"
    # the same +0.20 points, but with 1,000 images changing sides: within the interval
    noisy = _results(n, set(range(490, 8000)) | set(range(8000, 8510)))
    noisy_change = stats.paired_change(base, noisy)
    assert noisy_change.value == pytest.approx(0.20) and noisy_change.holds(0.0)
    assert stats.accuracy_verdict(noisy_change) == "the same"
    assert stats.accuracy_verdict(stats.paired_change(other, base)) == "lower"


def test_pairing_is_narrower_than_two_independent_intervals():
    n = 10_000
    base, other = _results(n, set(range(8000))), _results(n, set(range(20, 8040)))
    paired, unpaired = stats.paired_change(base, other), stats.unpaired_change(0.80, 0.802, n)
    assert paired.value == pytest.approx(unpaired.value)
    assert paired.high - paired.low < (unpaired.high - unpaired.low) / 5
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired_change(base, other[:-1])


def test_over_seeds_the_interval_covers_the_seeds_spread():
    tight = [stats.Interval(v, v - 0.1, v + 0.1, 10_000) for v in (-1.0, 0.0, 1.0)]
    combined = stats.over_seeds(tight)
    assert combined.value == pytest.approx(0.0) and combined.n == 3
    assert combined.high == pytest.approx(stats.t_quantile(2) * 1.0 / math.sqrt(3))  # the spread's, sd 1
    steady = [stats.Interval(v, v - 0.5, v + 0.5, 10_000) for v in (0.30, 0.31, 0.29)]
    assert stats.over_seeds(steady).high - 0.30 == pytest.approx(math.sqrt(3 * 0.25) / 3)  # pooled: wider here
    assert stats.over_seeds(tight[:1]) == tight[0]
