"""TopKRewardSelector: the best responses strictly above their group's median, each row once."""

from __future__ import annotations

import pytest
import torch

from llmrl.objectives import TopKRewardSelector
from tests.objectives.rows import batch


def test_keeps_the_top_k_above_the_median_best_first():
    # rewards [0, 1, 0, 0.5]: median (0 + 0.5) / 2 = 0.25; above it: 1 (row 1), 0.5 (row 3)
    rows = batch([0, 0, 0, 0], [0.0, 1.0, 0.0, 0.5])
    assert TopKRewardSelector(num_samples=4, top_k=1)(rows)["row_id"].tolist() == [1]
    assert TopKRewardSelector(num_samples=4, top_k=2)(rows)["row_id"].tolist() == [1, 3]
    # top_k larger than what is above the median: only those
    assert TopKRewardSelector(num_samples=4, top_k=4)(rows)["row_id"].tolist() == [1, 3]


def test_strictly_above_the_median():
    # [0, 1, 1, 1]: the median is 1, nothing is strictly above it
    assert TopKRewardSelector(num_samples=4, top_k=2)(batch([0] * 4, [0.0, 1.0, 1.0, 1.0])) is None
    # odd group [0, 3, 1, 3, 2]: median 2 (the middle value, kept out) -> the two 3s, in
    # arrival order (ties)
    out = TopKRewardSelector(num_samples=5, top_k=3)(batch([0] * 5, [0.0, 3.0, 1.0, 3.0, 2.0]))
    assert out["row_id"].tolist() == [1, 3]
    out = TopKRewardSelector(num_samples=5, top_k=3)(batch([0] * 5, [0.0, 3.0, 1.0, 4.0, 2.0]))
    assert out["row_id"].tolist() == [3, 1], "best first"


def test_groups_with_equal_rewards_write_nothing():
    selector = TopKRewardSelector(num_samples=2, top_k=1)
    assert selector(batch([0, 0, 1, 1], [1.0, 1.0, 0.0, 0.0])) is None
    out = selector(batch([2, 2, 3, 3], [1.0, 1.0, 0.0, 2.0], first_row=4))
    assert out["row_id"].tolist() == [7]
    assert [r.tolist() for r in out["tokens"].as_list("response")] == [[7] * 8]


def test_never_yields_a_row_twice_across_calls():
    selector = TopKRewardSelector(num_samples=3, top_k=2)
    calls = [
        batch([0, 1], [1.0, 5.0], first_row=0),
        batch([0, 2, 1], [3.0, 0.0, 4.0], first_row=2),
        batch([2, 0, 1, 2], [1.0, 2.0, 3.0, 2.0], first_row=5),
    ]
    seen: list[int] = []
    for rows in calls:
        out = selector(rows)
        if out is not None:
            seen += out["row_id"].tolist()
    # group 0: rewards 1, 3, 2 (rows 0, 2, 6) -> row 2; group 1: 5, 4, 3 (rows 1, 4, 7)
    # -> row 1; group 2: 0, 1, 2 (rows 3, 5, 8) -> row 8
    assert sorted(seen) == [1, 2, 8]
    assert len(seen) == len(set(seen))
    assert selector.pending_groups == 0
    with pytest.raises(ValueError, match="after its 3 rows were complete"):
        selector(calls[0])


def test_options_are_validated():
    with pytest.raises(ValueError, match="top_k must be in"):
        TopKRewardSelector(num_samples=4, top_k=0)
    with pytest.raises(ValueError, match="top_k must be in"):
        TopKRewardSelector(num_samples=4, top_k=5)
    with pytest.raises(KeyError, match="'reward'"):
        TopKRewardSelector(num_samples=1, top_k=1)(batch([0], [1.0]).exclude("reward"))


def test_reward_column_shape():
    rows = batch([0, 0], [0.0, 1.0]).set("reward", torch.tensor([[0.0], [1.0]]))
    assert TopKRewardSelector(num_samples=2, top_k=1)(rows)["row_id"].tolist() == [1]
