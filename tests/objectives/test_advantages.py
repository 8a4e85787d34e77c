"""MCAdvantage: hand-computed group-relative advantages, buffering of split and interleaved
groups, and the bounds on what is kept.

Tolerance: an advantage is a mean, a population std and a division on float32 rewards <= 16
(groups <= 5): a few roundings, <= ~4 eps = 5e-7 of values ~1, within ``abs=1e-6`` and
approx's default ``rel=1e-6``; a wrong baseline or std (Bessel's) moves one by >= 0.2.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.objectives import MCAdvantage
from tests.objectives.rows import batch


def test_group_scale_uses_the_population_std():
    # rewards [1, 2, 3]: mean 2, population std sqrt(((-1)^2 + 0 + 1^2) / 3) = sqrt(2/3)
    # -> advantages -+1 / sqrt(2/3) = -+sqrt(1.5) = -+1.2247449 (Bessel's std would give -+1)
    out = MCAdvantage(num_samples=3, eps=0.0)(batch([0, 0, 0], [1.0, 2.0, 3.0]))
    expected = [-math.sqrt(1.5), 0.0, math.sqrt(1.5)]
    assert out["advantage"].tolist() == pytest.approx(expected, abs=1e-6)
    assert out["advantage"].dtype == torch.float32
    # eps is added to the std: 1 / (sqrt(2/3) + 0.1)
    out = MCAdvantage(num_samples=3, eps=0.1)(batch([0, 0, 0], [1.0, 2.0, 3.0]))
    assert out["advantage"][2].item() == pytest.approx(1 / (math.sqrt(2 / 3) + 0.1), abs=1e-6)


def test_group_advantages_are_standardised_whatever_the_group_size():
    for size in (2, 5):
        rewards = [float(i * i) for i in range(size)]
        out = MCAdvantage(num_samples=size, eps=0.0)(batch([0] * size, rewards))
        advantage = out["advantage"]
        assert advantage.mean().item() == pytest.approx(0.0, abs=1e-6)
        assert (advantage**2).mean().item() == pytest.approx(1.0, abs=1e-5)


def test_batch_scale_divides_by_the_std_of_all_returned_rewards():
    # groups [0, 2] and [1, 5]: centred [-1, 1] and [-2, 2]; all rewards [0, 2, 1, 5] have
    # mean 2 and population std sqrt((4 + 0 + 1 + 9) / 4) = sqrt(3.5) = 1.8708287
    out = MCAdvantage(num_samples=2, scale="batch", eps=0.0)(
        batch([0, 0, 1, 1], [0.0, 2.0, 1.0, 5.0])
    )
    std = math.sqrt(3.5)
    assert out["advantage"].tolist() == pytest.approx([-1 / std, 1 / std, -2 / std, 2 / std])


def test_none_scale_is_dr_grpo():
    out = MCAdvantage(num_samples=2, scale="none")(batch([0, 0, 1, 1], [0.0, 2.0, 1.0, 5.0]))
    assert out["advantage"].tolist() == pytest.approx([-1.0, 1.0, -2.0, 2.0])


def test_zero_std_groups_get_exactly_zero():
    # 0.1 three times: the mean in float32 is not exactly 0.1, but the advantage is exactly 0
    out = MCAdvantage(num_samples=3)(batch([0, 0, 0, 1, 1, 1], [0.1] * 3 + [0.0, 1.0, 1.0]))
    assert out["advantage"][:3].tolist() == [0.0, 0.0, 0.0]
    assert out["advantage"][3] < 0 < out["advantage"][4]


def test_drop_zero_std_drops_and_counts():
    estimator = MCAdvantage(num_samples=2, drop_zero_std=True)
    out = estimator(batch([0, 0, 1, 1, 2, 2], [1.0, 1.0, 0.0, 1.0, 0.5, 0.5]))
    assert out["group_id"].tolist() == [1, 1]
    assert estimator.stats["dropped_zero_std_groups"] == 2
    # only a zero-std group completes: nothing to return
    assert estimator(batch([3, 3], [2.0, 2.0])) is None
    assert estimator.stats["dropped_zero_std_groups"] == 3


def test_one_sample_groups_have_zero_advantage():
    estimator = MCAdvantage(num_samples=1)
    out = estimator(batch([0, 1, 2], [0.0, 1.0, 5.0]))
    assert out["advantage"].tolist() == [0.0, 0.0, 0.0]
    assert estimator.pending_groups == 0


def test_groups_split_across_two_calls():
    estimator = MCAdvantage(num_samples=3, eps=0.0)
    # group 5 gets 2 of its 3 rows, group 6 all of them
    first = estimator(batch([5, 6, 6, 5, 6], [1.0, 0.0, 0.0, 2.0, 3.0], first_row=0))
    assert first["row_id"].tolist() == [1, 2, 4]
    assert estimator.pending_groups == 1
    second = estimator(batch([5], [3.0], first_row=5))
    assert second["row_id"].tolist() == [0, 3, 5], "the group's rows, in arrival order"
    assert second["advantage"].tolist() == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    assert estimator.pending_groups == 0
    # ragged entries come back with their rows
    responses = [r.tolist() for r in second["tokens"].as_list("response")]
    assert responses == [[0], [3, 3, 3, 3], [5] * 6]
    assert [p.tolist() for p in second["tokens"].as_list("prompt")] == [[7, 0], [7, 3], [7, 5]]


def test_nothing_complete_returns_none():
    estimator = MCAdvantage(num_samples=4)
    assert estimator(batch([0, 0, 1], [0.0, 1.0, 2.0])) is None
    assert estimator.pending_groups == 2


def test_interleaved_groups_come_out_contiguous_in_completion_order():
    estimator = MCAdvantage(num_samples=3)
    out = estimator(batch([0, 1, 0, 1, 1, 0], [0.0, 1.0, 1.0, 2.0, 3.0, 2.0]))
    # group 1 completes at row 4, group 0 at row 5
    assert out["group_id"].tolist() == [1, 1, 1, 0, 0, 0]
    assert out["row_id"].tolist() == [1, 3, 4, 0, 2, 5]


def test_overfull_group_raises_and_leaves_the_buffer_unchanged():
    estimator = MCAdvantage(num_samples=2)
    assert estimator(batch([9, 4], [0.0, 1.0])) is None
    with pytest.raises(ValueError, match="group 9 has 3 rows, more than num_samples=2"):
        estimator(batch([9, 9], [1.0, 2.0]))
    assert estimator.pending_groups == 2
    out = estimator(batch([9, 4], [1.0, 0.0], first_row=2))
    assert out["row_id"].tolist() == [0, 2, 1, 3]
    # a completed group is closed: late rows raise instead of being returned again
    with pytest.raises(ValueError, match="group 9 got 1 more row"):
        estimator(batch([9], [1.0]))


def test_incomplete_groups_are_bounded():
    estimator = MCAdvantage(num_samples=2, max_pending_groups=2)
    assert estimator(batch([0, 1, 2], [0.0, 0.0, 0.0])) is None
    assert estimator.pending_groups == 2
    assert estimator.stats["evicted_incomplete_groups"] == 1
    for group in range(3, 50):
        estimator(batch([group], [0.0]))
    assert estimator.pending_groups == 2, "memory never grows past max_pending_groups"
    assert estimator.stats["evicted_incomplete_groups"] == 48
    # the two newest groups are still there and complete normally
    out = estimator(batch([48, 49], [1.0, 1.0], first_row=100))
    assert out["group_id"].tolist() == [48, 48, 49, 49]


def test_reward_shapes_and_missing_keys():
    out = MCAdvantage(num_samples=2, scale="none")(
        batch([0, 0], [0.0, 1.0]).set("reward", torch.tensor([[0.0], [1.0]]))
    )
    assert out["advantage"].shape == (2,)
    estimator = MCAdvantage(num_samples=2)
    with pytest.raises(KeyError, match="'reward'"):
        estimator(batch([0, 0], [0.0, 1.0]).exclude("reward"))
    with pytest.raises(KeyError, match="'group_id'"):
        estimator(batch([0, 0], [0.0, 1.0]).exclude("group_id"))
    assert estimator.pending_groups == 0


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"options: \['group', 'batch', 'none'\]"):
        MCAdvantage(num_samples=2, scale="std")
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        MCAdvantage(num_samples=0)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        MCAdvantage(num_samples=2, eps=-1.0)
