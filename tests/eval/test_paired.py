"""The paired comparison of two evaluations: gain, bootstrap interval and McNemar p-value checked
against hand-computed values, and the errors of results that cannot be paired.

Tolerances: everything is float64 on counts; a p-value sums <= 41 binomial terms (~41 ulp:
1e-14 relative, under ``rel=1e-12``), other values are a division or two (approx's default
``rel=1e-6`` is ample).
"""

from __future__ import annotations

import doctest
import json
import math

import pytest

import llmrl.eval.paired as paired_module
from llmrl.eval.paired import bootstrap_interval, mcnemar_p, paired_gain


def _results(*correct: bool) -> dict[str, bool]:
    return {f"p{i}": right for i, right in enumerate(correct)}


def test_identical_results_gain_nothing_with_a_zero_width_interval() -> None:
    results = _results(True, False, True, False, False)
    gain = paired_gain(results, dict(results))
    assert (gain.gain, gain.ci_low, gain.ci_high) == (0.0, 0.0, 0.0)
    assert (gain.improved, gain.regressed, gain.p_value) == (0, 0, 1.0)
    assert gain.accuracy_before == gain.accuracy_after == pytest.approx(0.4)
    assert gain.num_problems == 5


@pytest.mark.parametrize("n", [1, 2, 5, 10])
def test_all_discordant_one_way_has_mcnemar_p_two_halves_to_the_n(n: int) -> None:
    before, after = _results(*[False] * n), _results(*[True] * n)
    up = paired_gain(before, after)
    assert up.p_value == pytest.approx(min(1.0, 2 * 0.5**n))
    assert (up.gain, up.ci_low, up.ci_high) == (1.0, 1.0, 1.0)  # every resample fixes all
    assert (up.improved, up.regressed) == (n, 0)
    down = paired_gain(after, before)  # the other way round: same p, opposite gain
    assert down.p_value == up.p_value
    assert (down.gain, down.ci_low, down.ci_high) == (-1.0, -1.0, -1.0)


@pytest.mark.parametrize(
    ("regressed", "improved", "expected"),
    [
        (0, 0, 1.0),  # no discordant problem: no evidence either way
        (1, 3, 2 * (1 + 4) / 16),  # 2 * P(X <= 1), X ~ Bin(4, 1/2)
        (2, 2, 1.0),  # 2 * (1 + 4 + 6) / 16 > 1: capped
        (0, 5, 2 / 32),
        # 2 * P(X <= 10), X ~ Bin(40, 1/2) (scipy.stats.binomtest(10, 40).pvalue)
        (10, 30, 0.0022214337732293643),
    ],
)
def test_mcnemar_p_by_hand(regressed: int, improved: int, expected: float) -> None:
    assert mcnemar_p(regressed, improved) == pytest.approx(expected, rel=1e-12)
    assert mcnemar_p(improved, regressed) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_p_stays_exact_for_thousands_of_problems() -> None:
    assert mcnemar_p(1000, 1000) == 1.0
    p = mcnemar_p(950, 1050)
    assert 0.02 < p < 0.04 and math.isfinite(p)  # normal approximation: z = 100 / sqrt(2000)


def test_two_fixed_of_four_has_the_interval_zero_to_one() -> None:
    """Four problems, two fixed and two tied: a resample's gain is k/4 with k ~ Bin(4, 1/2).
    P(k = 0) = P(k = 4) = 1/16 > 2.5%, so the 95% interval is exactly [0, 1]."""
    gain = paired_gain(_results(False, False, True, False), _results(True, True, True, False))
    assert (gain.improved, gain.regressed, gain.gain) == (2, 0, 0.5)
    assert (gain.ci_low, gain.ci_high) == (0.0, 1.0)
    assert gain.p_value == pytest.approx(0.5)  # 2 * 0.5**2


def test_a_hundred_problems_interval_matches_the_normal_approximation() -> None:
    """30 fixed, 10 broken, 60 tied: gain 0.2 with standard error sqrt((0.4 - 0.2**2) / 100) =
    0.06, so the interval is about 0.2 +- 1.96 * 0.06 = [0.082, 0.318]."""
    before = _results(*[True] * 10, *[False] * 30, *[True] * 20, *[False] * 40)
    after = _results(*[False] * 10, *[True] * 30, *[True] * 20, *[False] * 40)
    gain = paired_gain(before, after)
    assert (gain.improved, gain.regressed, gain.gain) == (30, 10, pytest.approx(0.2))
    assert 0.06 <= gain.ci_low <= 0.10 and 0.30 <= gain.ci_high <= 0.34
    assert gain.p_value == pytest.approx(0.0022214337732293643)
    # The bounds are resampled gains (multiples of 1/100), and a fixed seed repeats them.
    assert round(gain.ci_low * 100, 9).is_integer() and round(gain.ci_high * 100, 9).is_integer()
    assert paired_gain(before, after) == gain


def test_wider_confidence_gives_a_wider_interval() -> None:
    low_80, high_80 = bootstrap_interval(30, 10, 100, confidence=0.8)
    low_99, high_99 = bootstrap_interval(30, 10, 100, confidence=0.99)
    assert low_99 < low_80 < 0.2 < high_80 < high_99


def test_problems_are_matched_by_id_not_by_order() -> None:
    before = {"a": True, "b": False, "c": False}
    after = {"c": True, "a": True, "b": False}  # another order: only "c" was fixed
    gain = paired_gain(before, after)
    assert (gain.improved, gain.regressed) == (1, 0)


def test_mismatched_problem_ids_name_the_missing_ones() -> None:
    before = {"a": True, "b": False, "c": False}
    after = {"a": True, "b": True, "d": False}
    with pytest.raises(ValueError) as error:
        paired_gain(before, after, names=("sft", "grpo"))
    assert str(error.value) == (
        "sft and grpo answered different problems, so they cannot be paired: "
        "1 missing from grpo (c); 1 missing from sft (d)"
    )
    many = {f"q{i}": True for i in range(8)}
    with pytest.raises(ValueError, match=r"8 missing from after \(q0, q1, q2, q3, q4 and 3 more"):
        paired_gain({**before, **many}, before)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="no problems"):
        paired_gain({}, {})
    with pytest.raises(ValueError, match="confidence"):
        paired_gain(_results(True), _results(True), confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        paired_gain(_results(True), _results(True), resamples=0)
    with pytest.raises(ValueError, match="counts"):
        mcnemar_p(-1, 2)
    with pytest.raises(ValueError, match="improved"):
        bootstrap_interval(3, 2, 4)


def test_the_gain_is_json_ready_and_the_examples_hold() -> None:
    gain = paired_gain(_results(False, True), _results(True, True))
    assert json.loads(json.dumps(gain.as_dict()))["improved"] == 1
    assert doctest.testmod(paired_module).failed == 0
