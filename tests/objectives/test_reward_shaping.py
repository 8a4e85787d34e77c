"""Reward shaping (`llmrl.objectives.reward_shaping`): every option's numbers by hand, its
boundaries, the rows it touches (final replies, whole trajectories when masking), the counts it
logs, and the loss mask: a masked row adds nothing to the loss, its normalizer or its gradient."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl.config.reward_shaping import RewardShapingSettings
from llmrl.data import ChatHistory, History, Tokens
from llmrl.objectives import GRPOLoss
from llmrl.objectives.reward_shaping import (
    RewardShaper,
    ShapedRounds,
    length_reward,
    overlong_penalty,
    repetition_ratio,
)
from llmrl.objectives.token_level import LOSS_MASK_KEY, kept_rows

BUDGET = 10


def rows(
    lengths: list[int],
    rewards: list[float],
    groups: list[int] | None = None,
    complete: list[bool] | None = None,
    **columns: list,
) -> TensorDict:
    """Collector-like rows: responses of ``lengths`` distinct tokens (or ``tokens=``), rewards,
    group ids, and a history whose reply is cut off where ``complete`` is False."""
    responses = [torch.tensor(t) for t in columns.pop("tokens", [])] or [
        torch.arange(length) for length in lengths
    ]
    size = len(responses)
    td = TensorDict(
        {
            "tokens": Tokens.from_sequences(prompt=[torch.tensor([7])] * size, response=responses),
            "reward": torch.tensor(rewards),
            "group_id": torch.tensor(groups if groups is not None else [0] * size),
        },
        batch_size=[size],
    )
    if complete is not None:
        prompt = History.from_chats([[{"role": "user", "content": "q"}]] * size)
        replies = [{"role": "assistant", "content": "a", "is_complete": c} for c in complete]
        td.set("history", ChatHistory.from_histories(prompt, History.from_messages(replies)))
    for name, values in columns.items():
        td.set(name, torch.tensor(values))
    return td


def shaper(**settings: object) -> RewardShaper:
    return RewardShaper(RewardShapingSettings.model_validate(settings), max_new_tokens=BUDGET)


def test_the_overlong_penalty_is_zero_up_to_the_buffer_and_the_penalty_at_the_budget():
    # L_max 10, L_buf 4: the buffer starts after 6 tokens; penalty 2 at the budget
    lengths = torch.tensor([5.0, 6.0, 7.0, 9.0, 10.0])
    assert overlong_penalty(lengths, BUDGET, 4, 2.0).tolist() == [0.0, 0.0, -0.5, -1.5, -2.0]


def test_overlong_rows_get_the_penalty_added_and_are_counted():
    batch = rows([6, 7, 9, 10], [1.0, 0.0, 1.0, 1.0])
    counts = shaper(overlong_buffer={"length": 4, "penalty": 1.0})(batch)
    # -(7-6)/4, -(9-6)/4, -(10-6)/4 on the last three
    assert batch["reward"].tolist() == [1.0, -0.25, 0.25, 0.0]
    metrics = counts.metrics()
    assert metrics["shaping/overlong_rows"] == 3.0
    assert metrics["shaping/reward_delta_mean"] == -0.5  # (-0.25 - 0.75 - 1) / 4
    assert batch.get(LOSS_MASK_KEY, None) is None


def test_truncated_penalize_subtracts_the_penalty_from_cut_off_replies():
    batch = rows([3, 10, 4, 10], [1.0, 0.0, 1.0, 1.0], complete=[True, False, True, False])
    counts = shaper(truncated="penalize", truncated_penalty=0.5)(batch)
    assert batch["reward"].tolist() == [1.0, -0.5, 1.0, 0.5]
    assert counts.truncated_rows == 2 and counts.masked_rows == 0
    assert batch.get(LOSS_MASK_KEY, None) is None


def test_truncated_mask_clears_the_loss_mask_and_keeps_the_reward():
    batch = rows([3, 10, 4, 10], [1.0, 0.0, 1.0, 1.0], complete=[True, False, True, False])
    counts = shaper(truncated="mask")(batch)
    assert batch[LOSS_MASK_KEY].tolist() == [True, False, True, False]
    assert batch["reward"].tolist() == [1.0, 0.0, 1.0, 1.0]  # still in the group's baseline
    assert counts.metrics()["shaping/masked_rows"] == 2.0
    assert counts.metrics()["shaping/reward_delta_mean"] == 0.0


def test_a_cut_off_reply_is_told_by_is_complete_not_by_the_envs_truncated():
    # the env marks a single-turn reply that called a tool `truncated`; it ended on its own
    batch = rows([3, 10], [1.0, 1.0], complete=[True, True], truncated=[True, True])
    assert shaper(truncated="penalize", truncated_penalty=1.0)(batch).truncated_rows == 0
    assert batch["reward"].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"reward_shaping.truncated: .*\('history', 'full'\)"):
        shaper(truncated="mask")(rows([3], [1.0]))


def test_the_length_reward_by_hand():
    # group 0: lengths 2, 4, 6 -> lambda 0.5, 0, -0.5; the third is wrong: min(0, -0.5)
    # group 1: equal lengths -> 0; group 2: lengths 2, 6 -> lambda 0.5, -0.5, the short one
    # wrong: min(0, 0.5) = 0, the long one right: -0.5
    lengths = torch.tensor([2.0, 4.0, 6.0, 3.0, 3.0, 2.0, 6.0])
    correct = torch.tensor([True, True, False, True, False, False, True])
    got = length_reward(lengths, correct, [0, 0, 0, 1, 1, 2, 2])
    assert got.tolist() == [0.5, 0.0, -0.5, 0.0, 0.0, 0.0, -0.5]


def test_the_length_penalty_weights_it_and_reads_correct_or_else_a_positive_reward():
    batch = rows([2, 4, 6], [1.0, 1.0, 0.0], correct=[True, True, False])
    counts = shaper(length_penalty={"coeff": 0.2})(batch)
    assert batch["reward"].tolist() == pytest.approx([1.1, 1.0, -0.1])
    assert counts.length_penalized_rows == 2
    # no `correct` column: a reward > 0 is correct (the same verdicts here)
    batch = rows([2, 4, 6], [1.0, 1.0, 0.0])
    shaper(length_penalty={"coeff": 0.2})(batch)
    assert batch["reward"].tolist() == pytest.approx([1.1, 1.0, -0.1])


def test_the_repetition_ratio_by_hand():
    assert repetition_ratio(torch.tensor([1, 2, 1, 2, 1]), 2) == 0.5  # 12 21 12 21
    assert repetition_ratio(torch.tensor([5, 5, 5, 5]), 1) == 0.75  # 1 distinct of 4
    assert repetition_ratio(torch.tensor([1, 2, 3]), 2) == 0.0
    assert repetition_ratio(torch.tensor([1, 2]), 3) == 0.0  # shorter than n


def test_repetition_over_the_ratio_gets_the_reward_in_place_of_other_shaping():
    tokens = [[1, 2, 1, 2, 1], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [1, 2, 3, 4]]
    batch = rows([], [1.0, 1.0, 0.0], tokens=tokens)
    counts = shaper(
        repetition={"ngram": 2, "max_ratio": 0.5, "reward": -1.0},
        overlong_buffer={"length": 4, "penalty": 1.0},
    )(batch)
    # 0.5 is not over 0.5; the second (ratio 8/9, at the budget: -1 overlong) gets exactly -1
    assert batch["reward"].tolist() == [1.0, -1.0, 0.0]
    assert counts.repetition_rows == 1 and counts.overlong_rows == 1
    assert counts.reward_delta_sum == -2.0


def test_repetition_mask_takes_the_row_out_of_the_loss():
    batch = rows([], [1.0, 0.0], tokens=[[7, 7, 7, 7], [1, 2, 3, 4]])
    counts = shaper(repetition={"ngram": 1, "max_ratio": 0.5, "action": "mask"})(batch)
    assert batch[LOSS_MASK_KEY].tolist() == [False, True]
    assert batch["reward"].tolist() == [1.0, 0.0]
    assert counts.repetition_rows == 1 and counts.masked_rows == 1


def test_multi_turn_shaping_acts_on_final_replies_and_masks_whole_trajectories():
    # trajectory 0: a long tool-calling turn, then a cut-off final reply; trajectory 1: one turn
    batch = rows(
        [10, 10, 3],
        [0.0, 1.0, 1.0],
        complete=[True, False, True],
        traj_id=[0, 0, 1],
        done=[False, True, True],
    )
    counts = shaper(truncated="mask", overlong_buffer={"length": 4, "penalty": 1.0})(batch)
    assert batch["reward"].tolist() == [0.0, 0.0, 1.0]  # only the final reply is penalised
    assert batch[LOSS_MASK_KEY].tolist() == [False, False, True]
    assert (counts.overlong_rows, counts.truncated_rows, counts.masked_rows) == (1, 1, 2)


def test_off_leaves_the_batch_alone_and_reports_nothing():
    assert not RewardShapingSettings().enabled
    batch = rows([3, 10], [1.0, 0.5])
    before = batch.clone()
    rounds = ShapedRounds(lambda index: batch, None)
    assert rounds(0) is batch and rounds.metrics() == {}
    assert set(batch.keys()) == set(before.keys())
    assert torch.equal(batch["reward"], before["reward"])


def test_rounds_sum_their_counts_and_every_round_carries_the_mask_column():
    batches = iter(
        [rows([3, 10], [1.0, 0.0], complete=[True, False]), rows([3], [1.0], complete=[True])]
    )
    rounds = ShapedRounds(lambda index: next(batches), shaper(truncated="mask"))
    first, second = rounds(0), rounds(1)
    assert second[LOSS_MASK_KEY].tolist() == [True]  # concatenates with the first round's
    assert first[LOSS_MASK_KEY].tolist() == [True, False]
    assert rounds.metrics()["shaping/truncated_rows"] == 1.0
    assert rounds.counts.rows == 3


def test_the_shaper_refuses_a_buffer_as_long_as_the_budget():
    with pytest.raises(ValueError, match=r"reward_shaping\.overlong_buffer\.length"):
        RewardShaper(RewardShapingSettings(overlong_buffer={"length": BUDGET}), BUDGET)


def test_kept_rows_without_a_column_is_the_mask_itself():
    mask = torch.tensor([[True, False], [True, True]])
    assert kept_rows(TensorDict({}, [2]), mask) is mask
    td = TensorDict({LOSS_MASK_KEY: torch.tensor([False, True])}, [2])
    assert kept_rows(td, mask).tolist() == [[False, False], [True, True]]


KEPT = [0, 2, 3, 5]


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_masked_rows_add_nothing_to_the_loss_or_its_gradient(sampler, rollout, tiny):
    rollout.set(LOSS_MASK_KEY, torch.tensor([i in KEPT for i in range(6)]))
    loss = GRPOLoss(sampler)
    out = loss(rollout)
    out.loss.backward()
    masked_grads = _grads(tiny)
    # a masked row's advantage can be anything: not one bit of the loss or gradient moves
    tiny.zero_grad(set_to_none=True)
    wild = rollout.clone(False)
    wild.set("advantage", torch.where(wild[LOSS_MASK_KEY], wild["advantage"], 1e6))
    again = loss(wild)
    again.loss.backward()
    assert torch.equal(again.loss, out.loss)
    assert all(torch.equal(a, b) for a, b in zip(_grads(tiny), masked_grads, strict=True))
    # and the loss is the one of the kept rows alone (token_mean over their tokens)
    tiny.zero_grad(set_to_none=True)
    alone = loss(rollout.exclude(LOSS_MASK_KEY)[torch.tensor(KEPT)])
    alone.loss.backward()
    assert float(out.normalizer) == float(alone.normalizer)
    assert torch.allclose(out.loss, alone.loss, atol=1e-6)
    for got, want in zip(masked_grads, _grads(tiny), strict=True):
        assert torch.allclose(got, want, atol=1e-6)


def test_a_masked_rows_tokens_get_zero_per_token_loss(sampler, rollout):
    rollout.set(LOSS_MASK_KEY, torch.tensor([i in KEPT for i in range(6)]))
    per_token = GRPOLoss(sampler, aggregation="none")(rollout).loss
    assert per_token[1].abs().sum() == 0 and per_token[4].abs().sum() == 0
    assert per_token[0].abs().sum() > 0
