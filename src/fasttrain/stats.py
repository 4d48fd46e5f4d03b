"""How sure a comparison is: 95% intervals for a speed, a speed-up and an accuracy change, and the
verdicts read from them. Standard library only; every function takes plain numbers.

- A speed (images/s) is the mean of the run's steady samples (epochs after the first, or windows of
  steps when there are few epochs) with Student's t interval.
- A speed-up is the ratio of two such means; its interval is taken on the log of the ratio (the
  delta method), with Welch's degrees of freedom, and mapped back, so it is never below zero.
- An accuracy change on one test set is paired: both models classified the same images, so the
  interval is that of the mean of the per-image differences (right in one model, wrong in the other),
  which is much narrower than two independent binomial intervals. Over several seeds it is the wider
  of the mean's t interval over the seeds' changes and the pooled paired intervals.
- A verdict comes from the interval alone: "faster" only when the whole interval of the speed-up is
  above 1, "lower" only when the whole interval of the accuracy change is below 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev

LEVEL = 0.95
Z = NormalDist().inv_cdf(0.5 + LEVEL / 2)  # 1.95996...
# Student's t, two-sided 95%, by degrees of freedom 1..30; beyond, the Cornish-Fisher expansion (t_quantile)
_T = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
      2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: float) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (a fractional df, as Welch's,
    rounds down: the wider interval)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df < len(_T) + 1:
        return _T[int(df + 1e-9) - 1]  # (a Welch df of 6 can come out as 5.999...)
    z, v = Z, df
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float
    n: int  # the samples behind it: steady epochs or windows, test images, or seeds

    def around(self, value: float) -> Interval:
        """The same relative width around another estimate of the same quantity (a run's headline
        images/s, total images over total seconds, rather than the mean of its samples' rates)."""
        return Interval(value, self.low * value / self.value, self.high * value / self.value, self.n)

    def holds(self, x: float) -> bool:
        return self.low <= x <= self.high

    def to_dict(self, digits: int) -> dict:
        return {"value": round(self.value, digits), "low": round(self.low, digits),
                "high": round(self.high, digits), "n": self.n}


def mean_interval(samples: list[float]) -> Interval | None:
    """The mean with Student's t interval; None with fewer than two samples (no spread to measure)."""
    if len(samples) < 2:
        return None
    m = fmean(samples)
    half = t_quantile(len(samples) - 1) * stdev(samples) / math.sqrt(len(samples))
    return Interval(m, m - half, m + half, len(samples))


def ratio_interval(a: list[float], b: list[float]) -> Interval | None:
    """mean(a) / mean(b), independent samples: the interval of the log ratio, se from each mean's
    relative standard error, Welch-Satterthwaite degrees of freedom."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = fmean(a), fmean(b)
    if ma <= 0 or mb <= 0:
        raise ValueError(f"speeds must be positive, got means {ma} and {mb}")
    va, vb = (stdev(a) / ma) ** 2 / len(a), (stdev(b) / mb) ** 2 / len(b)  # squared relative standard errors
    ratio = ma / mb
    if va + vb == 0:
        return Interval(ratio, ratio, ratio, min(len(a), len(b)))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(df) * math.sqrt(va + vb)
    return Interval(ratio, ratio * math.exp(-half), ratio * math.exp(half), min(len(a), len(b)))


def paired_change(base: str, other: str) -> Interval:
    """Accuracy of `other` less that of `base`, in points, from per-image results ("1" = classified
    right) on the same images in the same order: the mean of the per-image differences with its
    normal interval (n is the test set's size: thousands)."""
    if len(base) != len(other) or not base:
        raise ValueError(f"per-image results differ in length: {len(base)} and {len(other)} images")
    n = len(base)
    gained = sum(1 for x, y in zip(base, other) if x == "0" and y == "1")
    lost = sum(1 for x, y in zip(base, other) if x == "1" and y == "0")
    mean = (gained - lost) / n
    variance = ((gained + lost) / n - mean**2) * n / max(1, n - 1)
    half = Z * math.sqrt(max(0.0, variance) / n)
    return Interval(100 * mean, 100 * (mean - half), 100 * (mean + half), n)


def unpaired_change(base: float, other: float, n: int) -> Interval:
    """Accuracy change in points from two accuracies on n images each, as if independent: wider than
    the paired interval; for records without per-image results."""
    half = Z * math.sqrt((base * (1 - base) + other * (1 - other)) / n)
    return Interval(100 * (other - base), 100 * (other - base - half), 100 * (other - base + half), n)


def over_seeds(changes: list[Interval]) -> Interval:
    """One accuracy change from one per seed: their mean, with the wider of the t interval over the
    seeds (the seed's spread, test-set noise included) and the seeds' own intervals pooled."""
    if len(changes) == 1:
        return changes[0]
    m = fmean(c.value for c in changes)
    pooled = math.sqrt(sum(((c.high - c.low) / 2) ** 2 for c in changes)) / len(changes)
    spread = t_quantile(len(changes) - 1) * stdev(c.value for c in changes) / math.sqrt(len(changes))
    half = max(pooled, spread)
    return Interval(m, m - half, m + half, len(changes))


def speed_verdict(speedup: Interval | None) -> str | None:
    if speedup is None:
        return None
    return "faster" if speedup.low > 1 else "slower" if speedup.high < 1 else "no different"


def accuracy_verdict(change: Interval | None) -> str | None:
    if change is None:
        return None
    return "higher" if change.low > 0 else "lower" if change.high < 0 else "the same"
