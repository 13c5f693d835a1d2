"""Deciding between two layouts from interleaved samples, and knowing when the noise decides.

Every choice a plan makes compares two candidates measured in the same rounds (A B, A B, ...).
Each round gives one paired ratio, ``alternative / default``: load from other processes hits
both halves of a round alike, so the ratio cancels most of it. The decision looks at the
median of those ratios and a distribution-free confidence interval of that median (order
statistics of the binomial, at least 98%: the rounds are looked at again as they grow, and
every look is one more chance for noise to pass as a difference):

* ``alternative``: the whole interval lies below ``1 - margin``: the alternative is faster by
  more than the margin, clearly;
* ``default``: the whole interval lies above ``1 - margin``: whatever the alternative gains, it
  is less than the margin, clearly;
* ``within noise``: the interval straddles ``1 - margin``. More rounds narrow it; when the
  budget is spent, the default is kept and the decision is marked as within noise.

An interval needs at least :data:`MIN_ROUNDS` rounds (with seven, the interval from the
smallest to the largest ratio covers the median with 98.4% confidence); fewer rounds are always
within noise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

#: rounds a decision needs before it can be clear
MIN_ROUNDS = 7


#: the confidence of the interval around the median ratio
CONFIDENCE = 0.98


ALTERNATIVE, DEFAULT, NOISE = "alternative", "default", "within noise"


@dataclass(frozen=True)
class Decision:
    """One comparison of two candidates: ``ratio`` is the median over rounds of
    ``alternative / default`` (below 1: the alternative is faster), ``low``/``high`` its
    confidence interval, ``repeats`` the rounds taken, ``verdict`` one of ``alternative``,
    ``default``, ``within noise``."""

    ratio: float
    low: float
    high: float
    repeats: int
    verdict: str

    @property
    def within_noise(self) -> bool:
        return self.verdict == NOISE

    @property
    def takes_alternative(self) -> bool:
        return self.verdict == ALTERNATIVE


def median_interval(samples: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the k-th smallest and k-th
    largest samples, k the largest rank whose binomial tail stays below ``(1 - confidence) / 2``
    (at least 1: the smallest and largest sample)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    k, tail = 1, 0.0
    # P(Binomial(n, 1/2) <= j) for j = 0, 1, ...: the interval [x_(j+1), x_(n-j)] misses the
    # median with probability 2 * P(B <= j)
    for j in range(n // 2):
        tail += math.comb(n, j) / 2**n
        if tail > alpha:
            break
        k = j + 1
    return xs[k - 1], xs[n - k]


def decide(ratios: list[float], margin: float) -> Decision:
    """The decision from paired ratios ``alternative / default`` (see the module docstring)."""
    ratios = [r for r in ratios if math.isfinite(r)]
    if not ratios:
        return Decision(float("nan"), float("nan"), float("nan"), 0, NOISE)
    med = statistics.median(ratios)
    low, high = median_interval(ratios)
    threshold = 1 - margin
    if len(ratios) < MIN_ROUNDS:
        verdict = NOISE
    elif high < threshold:
        verdict = ALTERNATIVE
    elif low > threshold:
        verdict = DEFAULT
    else:
        verdict = NOISE
    return Decision(med, low, high, len(ratios), verdict)


def agreeing(decision: Decision, alternative: list[float], default: list[float]) -> Decision:
    """``decision`` (from the paired ratios of these samples), within noise where the two
    candidates' own medians say the other direction: the ratio of the medians and the median of
    the paired ratios estimate one thing, and where they disagree about which side of 1 it lies
    on, no table that shows both can claim either."""
    if not alternative or not default or not math.isfinite(decision.ratio):
        return decision
    of_medians = statistics.median(alternative) / statistics.median(default)
    if (of_medians - 1) * (decision.ratio - 1) < 0 and decision.verdict != NOISE:
        return Decision(decision.ratio, decision.low, decision.high, decision.repeats, NOISE)
    return decision


def ratios(alternative: list[float], default: list[float]) -> list[float]:
    """Per round, ``alternative / default`` (the rounds both have)."""
    return [a / d if d > 0 else float("inf") for a, d in zip(alternative, default)]
