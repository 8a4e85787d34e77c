"""MCAdvantage on multi-turn episodes: one advantage per trajectory (from its final reward),
written on every turn's row; groups complete once their G trajectories are done.

Tolerance: as in test_advantages.py, a few float32 roundings of values ~1 (<= 5e-7), within
``abs=1e-6`` and approx's default ``rel=1e-6``.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.collectors import LLMCollector
from llmrl.envs import DatasetChatEnv, EnvTransform
from llmrl.objectives import MCAdvantage
from tests.objectives.rows import turns
from tests.support.scripted import FakeTool, ScriptedPolicy


def test_three_turn_and_one_turn_episodes_share_one_group():
    # G = 4: trajectories 10 and 11 take 3 turns, 12 and 13 one, rows interleaved by step.
    # Final rewards [3, 1, 0, 0] (earlier turns' 5.0 and 9.0 are ignored): mean 1, centred
    # [2, 0, -1, -1], population std sqrt((4 + 0 + 1 + 1) / 4) = sqrt(1.5)
    rows = [
        (0, 10, False, 5.0),
        (0, 11, False, 9.0),
        (0, 12, True, 0.0),
        (0, 13, True, 0.0),
        (0, 10, False, 5.0),
        (0, 11, False, 9.0),
        (0, 10, True, 3.0),
        (0, 11, True, 1.0),
    ]
    out = MCAdvantage(num_samples=4, eps=0.0)(turns(rows))
    a = [2 / math.sqrt(1.5), 0.0, -1 / math.sqrt(1.5), -1 / math.sqrt(1.5)]
    expected = [a[0], a[1], a[2], a[3], a[0], a[1], a[0], a[1]]
    assert out["row_id"].tolist() == list(range(8))
    assert out["advantage"].tolist() == pytest.approx(expected, abs=1e-6)
    # Dr. GRPO: the centred final rewards, broadcast
    out = MCAdvantage(num_samples=4, scale="none")(turns(rows))
    assert out["advantage"].tolist() == [2.0, 0.0, -1.0, -1.0, 2.0, 0.0, 2.0, 0.0]


def test_a_group_waits_until_every_trajectory_is_done():
    estimator = MCAdvantage(num_samples=2, eps=0.0)
    # 2 episodes x 3 turns, one step per call: final rewards 1 and 0 -> +1 and -1
    assert estimator(turns([(4, 0, False, 0.0), (4, 1, False, 0.0)])) is None
    assert estimator(turns([(4, 0, False, 0.0), (4, 1, False, 0.0)])) is None
    assert estimator.pending_groups == 1, "two trajectories, neither done"
    out = estimator(turns([(4, 0, True, 1.0), (4, 1, True, 0.0)]))
    assert out["traj_id"].tolist() == [0, 1, 0, 1, 0, 1], "the group's rows, in arrival order"
    assert out["advantage"].tolist() == pytest.approx([1.0, -1.0] * 3)
    assert estimator.pending_groups == 0


def test_one_done_trajectory_does_not_complete_its_group():
    estimator = MCAdvantage(num_samples=2, scale="none")
    # trajectory 0 ended after one turn; trajectory 1 is still going: nothing yet
    assert estimator(turns([(1, 0, True, 2.0), (1, 1, False, 0.0)])) is None
    out = estimator(turns([(1, 1, True, 1.0)]))
    assert out["advantage"].tolist() == [0.5, -0.5, -0.5]


def test_batch_scale_is_over_trajectories_not_rows():
    # group 0: a 3-turn episode (final 0) and a 1-turn one (final 2); group 1: finals 1 and 5.
    # The std is over the 4 final rewards [0, 2, 1, 5] (sqrt(3.5)), not over the 6 rows
    rows = [
        (0, 0, False, 0.0),
        (0, 0, False, 0.0),
        (0, 0, True, 0.0),
        (0, 1, True, 2.0),
        (1, 2, True, 1.0),
        (1, 3, True, 5.0),
    ]
    out = MCAdvantage(num_samples=2, scale="batch", eps=0.0)(turns(rows))
    std = math.sqrt(3.5)
    expected = [-1 / std, -1 / std, -1 / std, 1 / std, -2 / std, 2 / std]
    assert out["advantage"].tolist() == pytest.approx(expected)


def test_drop_zero_std_looks_at_final_rewards_only():
    estimator = MCAdvantage(num_samples=2, drop_zero_std=True)
    # the first turns differ (0.5 vs 0), the final rewards are equal: no signal, dropped
    rows = [(0, 0, False, 0.5), (0, 0, True, 1.0), (0, 1, True, 1.0)]
    assert estimator(turns(rows)) is None
    assert estimator.stats["dropped_zero_std_groups"] == 1


def test_trajectory_errors_name_the_group_and_leave_the_buffer_unchanged():
    estimator = MCAdvantage(num_samples=2)
    assert estimator(turns([(7, 0, False, 0.0), (7, 1, True, 0.0)])) is None
    with pytest.raises(ValueError, match="group 7 has 3 trajectories, more than num_samples=2"):
        estimator(turns([(7, 2, True, 1.0)]))
    with pytest.raises(ValueError, match="group 7: trajectory 1 got a row after its 'done' row"):
        estimator(turns([(7, 1, True, 1.0)]))
    with pytest.raises(KeyError, match="'done'"):
        estimator(turns([(7, 0, True, 1.0)]).exclude("done"))
    assert estimator.pending_groups == 1
    out = estimator(turns([(7, 0, True, 1.0)]))
    assert out["traj_id"].tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="group 7 got 1 more row"):
        estimator(turns([(7, 0, True, 1.0)]))


def test_trajectory_key_none_treats_every_row_as_a_trajectory():
    rows = [(0, 0, False, 0.0), (0, 0, True, 1.0)]
    out = MCAdvantage(num_samples=2, scale="none", trajectory_key=None)(turns(rows))
    assert out["advantage"].tolist() == [-0.5, 0.5]


class _ReplyReward(EnvTransform):
    """Reward 1 for 'right', 0.5 for a tool call, 0 otherwise."""

    def on_step(self, td):
        replies = [chat[-1]["content"] for chat in td.get(("history", "full")).to_chats()]
        values = [{"right": 1.0, "CALL": 0.5}.get(reply, 0.0) for reply in replies]
        td.set("reward", td.get("reward") + torch.tensor(values))
        return td


def _sample_policy(td):
    """Sample 0 of each group calls the tool once, then answers 'right'; sample 1 answers
    'wrong' at once."""
    chats = td.get(("history", "prompt")).to_chats()
    replies = [
        "wrong" if sample else ("right" if chat[-1]["role"] == "tool" else "CALL")
        for chat, sample in zip(chats, td.get("sample_index").tolist(), strict=True)
    ]
    return ScriptedPolicy(replies)(td)


def test_collector_episodes_get_their_trajectory_advantage_on_every_turn():
    rows = [{"id": f"p{i}", "prompt": f"q{i}", "answer": ""} for i in range(4)]
    env = DatasetChatEnv(
        rows, batch_size=2, repeats=2, max_turns=3, shuffle=False, transforms=[FakeTool()]
    )
    env.append_transform(_ReplyReward())
    collector = LLMCollector(env, _sample_policy, dialog_turns_per_batch=3, total_dialog_turns=6)
    estimator = MCAdvantage(num_samples=2, eps=0.0)
    outs = [estimator(batch) for batch in collector]
    # reset: trajectories 0, 1 (group 0) and 2, 3 (group 1); samples 0 (even ids) take two
    # turns, final reward 1 (their tool call earned 0.5); samples 1 one turn, final reward 0.
    # Batch 1: trajectories 1, 3 (done at step 1) and 0; batch 2: trajectory 2 and the next
    # reset's trajectory 5 (its group waits for trajectory 4)
    assert [out["traj_id"].tolist() for out in outs] == [[1, 0, 0], [3, 2, 2]]
    assert [out["turn"].tolist() for out in outs] == [[0, 0, 1], [0, 0, 1]]
    assert [out["group_id"].tolist() for out in outs] == [[0, 0, 0], [1, 1, 1]]
    for out in outs:
        assert out["reward"].tolist() == [0.0, 0.5, 1.0]
        assert out["advantage"].tolist() == pytest.approx([-1.0, 1.0, 1.0])
    assert estimator.pending_groups == 1
