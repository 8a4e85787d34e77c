"""Micro-batch plans and token-balanced rank shards (llmrl/train/micro_batches.py), by hand."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from llmrl.data import Tokens
from llmrl.runtime import split_groups
from llmrl.train.micro_batches import (
    balanced_assignment,
    row_plan,
    sequence_lengths,
    take,
    token_plan,
)


def _batch(prompt_lengths: list[int], response_lengths: list[int]) -> TensorDict:
    tokens = Tokens.from_sequences(
        prompt=[torch.arange(n) for n in prompt_lengths],
        response=[torch.arange(n) for n in response_lengths],
    )
    rows = len(prompt_lengths)
    return TensorDict({"tokens": tokens, "row": torch.arange(rows)}, batch_size=[rows])


def test_rows_are_cut_into_even_contiguous_runs():
    assert row_plan(5, 2) == [[0, 1], [2, 3, 4]]  # round() halves to even
    assert row_plan(2, 3) == [[0], [], [1]]


def test_token_plans_fill_micro_batches_up_to_the_budget():
    # 25 and 19 open micro-batches; 12 joins 19 (31); 8 joins 25 (33); 5 fits neither: a third
    assert token_plan([12, 25, 5, 19, 8], 34) == [[1, 4], [0, 3], [2]]
    assert token_plan([40, 3], 34) == [[0], [1]]  # a row over the budget goes alone
    assert token_plan([], 34) == [[]]  # an empty part: one empty pass


def test_sequence_lengths_count_prompt_and_response():
    batch = _batch([3, 5, 2], [4, 1, 7])
    assert sequence_lengths(batch) == [7, 6, 9]


def test_take_keeps_the_order_asked_for():
    batch = _batch([1, 2, 3, 4], [1, 1, 1, 1])
    assert take(batch, [1, 2])["row"].tolist() == [1, 2]
    assert take(batch, [3, 0])["row"].tolist() == [3, 0]
    assert take(batch, []).batch_size[0] == 0


def test_the_costliest_items_go_first_to_the_least_loaded_part():
    # 9 -> part 0; 7 -> part 1; 4 -> part 1 (7 < 9: 11); 3 -> part 0 (12); 2 -> part 1 (13)
    assert balanced_assignment([3, 9, 2, 7, 4], 2) == [[0, 1], [2, 3, 4]]
    assert balanced_assignment([5], 3) == [[0], [], []]


def test_token_balanced_shards_hold_whole_groups_and_even_tokens():
    # 4 groups of 2: tokens 2 x (10 + 30), 2 x (10 + 2), 2 x (10 + 28), 2 x (10 + 4)
    batch = _batch([10] * 8, [30, 30, 2, 2, 28, 28, 4, 4])
    by_groups = split_groups(batch, 2, 2)
    by_tokens = split_groups(batch, 2, 2, by_tokens=True)
    assert [shard["row"].tolist() for shard, _ in by_groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # groups cost 80, 24, 76, 28: 80 -> shard 0; 76 -> shard 1; 28 -> shard 1; 24 -> shard 0
    assert [shard["row"].tolist() for shard, _ in by_tokens] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [sum(sequence_lengths(s)) for s, _ in by_tokens] == [104, 104]
    uneven = _batch([10] * 8, [30, 30, 28, 28, 2, 2, 4, 4])
    shards = split_groups(uneven, 2, 2, by_tokens=True)
    # 80 -> 0; 76 -> 1; 28 -> 1 (76 < 80); 24 -> 0: rows of groups 0 and 2, then 1 and 3
    assert [s["row"].tolist() for s, _ in shards] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [stand_in for _, stand_in in shards] == [False, False]
