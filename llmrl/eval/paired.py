"""Is model B better than model A on the same problems? The accuracy gain of B over A, its paired
95% bootstrap interval, and the exact McNemar test as a second opinion.

Both models answered the same held-out problems, so their results are *paired*: what matters is
how many problems B fixed (wrong for A, right for B) and how many it broke (right for A, wrong for
B); problems both got right, or both wrong, say nothing about the difference. Comparing two
accuracies as if they came from independent samples would ignore that and give intervals that
are too wide (or, with a noisy but correlated pair, too narrow).

- **Gain**: ``(fixed - broken) / n``, the difference of the two accuracies.
- **Interval**: the percentile bootstrap over problems: resample the ``n`` problems with
  replacement, recompute the gain, take the 2.5% and 97.5% quantiles of 10,000 resamples (fixed
  seed: the same results always give the same interval). A resample's gain depends only on how
  many fixed, broken and tied problems it drew, which is one multinomial draw over the three
  groups, so all resamples take one vectorised numpy call. The bounds are resampled gains (the
  lower one rounded down, the upper one up), so an interval never excludes 0 by interpolation.
- **McNemar**: the exact two-sided test of "fixing and breaking are equally likely": under it,
  the ``b + c`` discordant problems split as a fair coin, so ``p = 2 * P(X <= min(b, c))`` with
  ``X ~ Binomial(b + c, 1/2)`` (capped at 1).

Example:
    >>> before = {"p1": False, "p2": False, "p3": True, "p4": True}
    >>> after = {"p1": True, "p2": True, "p3": True, "p4": True}
    >>> gain = paired_gain(before, after)
    >>> gain.gain, gain.improved, gain.regressed, gain.p_value
    (0.5, 2, 0, 0.5)
    >>> mcnemar_p(0, 3)  # three problems fixed, none broken: 2 * 0.5**3
    0.25
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
"""Default confidence of the interval."""
RESAMPLES = 10_000
"""Default number of bootstrap resamples."""
SEED = 0
"""Default seed of the bootstrap (fixed: the same results give the same interval)."""
_SHOWN_IDS = 5


@dataclass(frozen=True)
class PairedGain:
    """The gain of one evaluation (``after``) over another (``before``) on the same problems.

    ``improved``: problems wrong before and right after (McNemar's ``c``); ``regressed``: right
    before and wrong after (``b``). ``gain = (improved - regressed) / num_problems``, in
    ``[ci_low, ci_high]`` with probability ``confidence`` (paired bootstrap); ``p_value`` is the
    exact McNemar test's.
    """

    num_problems: int
    accuracy_before: float
    accuracy_after: float
    improved: int
    regressed: int
    gain: float
    ci_low: float
    ci_high: float
    p_value: float
    confidence: float = CONFIDENCE
    resamples: int = RESAMPLES

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def paired_gain(
    before: Mapping[str, bool],
    after: Mapping[str, bool],
    *,
    names: tuple[str, str] = ("before", "after"),
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> PairedGain:
    """The gain of ``after`` over ``before``: per problem id, whether each answered it correctly.

    ``names`` name the two evaluations in error messages.

    Raises:
        ValueError: the two did not answer the same problems (the message names the ids missing
            from each), there are no problems, or ``confidence`` / ``resamples`` are out of range.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    _check_same_problems(before, after, names)
    n = len(before)
    if n == 0:
        raise ValueError(f"{names[0]} and {names[1]}: no problems to compare")
    improved = sum(1 for pid, right in after.items() if right and not before[pid])
    regressed = sum(1 for pid, right in after.items() if not right and before[pid])
    low, high = bootstrap_interval(
        improved, regressed, n, confidence=confidence, resamples=resamples, seed=seed
    )
    return PairedGain(
        num_problems=n,
        accuracy_before=sum(map(bool, before.values())) / n,
        accuracy_after=sum(map(bool, after.values())) / n,
        improved=improved,
        regressed=regressed,
        gain=(improved - regressed) / n,
        ci_low=low,
        ci_high=high,
        p_value=mcnemar_p(regressed, improved),
        confidence=confidence,
        resamples=resamples,
    )


def bootstrap_interval(
    improved: int,
    regressed: int,
    n: int,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """The percentile bootstrap interval of the paired gain ``(improved - regressed) / n``.

    Each resample draws ``n`` problems with replacement; how many of them are improved,
    regressed or tied is one multinomial draw, so the resamples are drawn in one call. The lower
    bound is the resampled gain at or below the ``(1 - confidence) / 2`` quantile, the upper one
    the resampled gain at or above the ``(1 + confidence) / 2`` quantile.
    """
    if n < 1 or improved < 0 or regressed < 0 or improved + regressed > n:
        raise ValueError(
            f"need n >= 1 and 0 <= improved + regressed <= n, got {improved}, {regressed}, {n}"
        )
    rng = np.random.default_rng(seed)
    groups = np.array([improved, regressed, n - improved - regressed], dtype=np.float64) / n
    draws = rng.multinomial(n, groups, size=resamples)
    gains = (draws[:, 0] - draws[:, 1]) / n
    tail = (1.0 - confidence) / 2.0
    low = np.quantile(gains, tail, method="lower")
    high = np.quantile(gains, 1.0 - tail, method="higher")
    return float(low), float(high)


def mcnemar_p(regressed: int, improved: int) -> float:
    """The exact two-sided McNemar p-value of ``regressed`` (b) against ``improved`` (c).

    ``2 * P(X <= min(b, c))`` for ``X ~ Binomial(b + c, 1/2)``, capped at 1; 1 without
    discordant problems. Computed with exact integers.

    Example:
        >>> mcnemar_p(1, 3)  # 2 * (1 + 4) / 16
        0.625
    """
    if regressed < 0 or improved < 0:
        raise ValueError(f"counts must be >= 0, got {regressed}, {improved}")
    n = regressed + improved
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(regressed, improved) + 1))
    return min(1.0, 2 * tail / 2**n)


def _check_same_problems(
    before: Mapping[str, bool], after: Mapping[str, bool], names: tuple[str, str]
) -> None:
    missing_after = [pid for pid in before if pid not in after]
    missing_before = [pid for pid in after if pid not in before]
    if not missing_after and not missing_before:
        return
    parts = [
        f"{len(ids)} missing from {name} ({_some(ids)})"
        for name, ids in ((names[1], missing_after), (names[0], missing_before))
        if ids
    ]
    raise ValueError(
        f"{names[0]} and {names[1]} answered different problems, so they cannot be paired: "
        + "; ".join(parts)
    )


def _some(ids: list[str]) -> str:
    shown = ", ".join(ids[:_SHOWN_IDS])
    return shown + (f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else "")
