"""ModelReward: a model's score of each final reply, weighted (and normalised) into the reward,
with hand-computed values; failures and garbage fall back, counted, and never raise; only the
replies that end their episode are scored."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from llmrl.data import ChatHistory, History
from llmrl.envs.transforms import ModelReward
from llmrl.scorers.errors import ModelCallError
from tests.support.scripted import CALLS, CallingPolicy, tool_env


def _batch(responses: list[str], task_reward: list[float]) -> TensorDict:
    chats = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": response},
        ]
        for i, response in enumerate(responses)
    ]
    batch = len(responses)
    td = TensorDict(
        {
            "reward": torch.tensor(task_reward),
            "answer": NonTensorStack(*(f"a{i}" for i in range(batch))),
            "tool_called": torch.zeros(batch, dtype=torch.bool),
        },
        batch_size=[batch],
    )
    td.set("history", ChatHistory(full=History.from_chats(chats), batch_size=[batch]))
    return td


class Scripted:
    """Answers each call with the next list of scores (or raises it); records the requests."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.seen: list[list[dict]] = []

    def __call__(self, requests):
        self.seen.append(requests)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_weighted_scores_and_fallbacks_add_to_the_task_reward():
    scorer = Scripted([2.0, None, 4.0, math.nan, "garbage"])
    reward = ModelReward("judge", scorer, weight=0.5, fallback_reward=-1.0)
    td = reward.on_step(_batch(["r0", "r1", "r2", "r3", "r4"], [1.0, 0.0, 1.0, 0.0, 0.0]))
    assert td["reward"].tolist() == [2.0, -0.5, 3.0, -0.5, -0.5]
    assert td["judge_score"].tolist() == [2.0, -1.0, 4.0, -1.0, -1.0]
    assert td["judge_failed"].tolist() == [False, True, False, True, True]
    [requests] = scorer.seen
    assert requests[2] == {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q2"}],
        "response": "r2",
        "reference": "a2",
    }


def test_normalised_scores_are_z_scored_over_the_rows_that_did_not_fail():
    reward = ModelReward(
        "reward_model", Scripted([1.0, 3.0, None, 5.0]), weight=2.0, normalize=True,
        fallback_reward=0.25,
    )  # fmt: skip
    td = reward.on_step(_batch(["a", "b", "c", "d"], [0.0, 0.0, 0.0, 0.0]))
    z = 2 / math.sqrt(8 / 3)  # mean 3, population std sqrt(((1-3)^2 + 0 + (5-3)^2) / 3)
    assert td["reward"].tolist() == pytest.approx([-2 * z, 0.0, 0.5, 2 * z])
    assert td["reward_model_score"].tolist() == [1.0, 3.0, 0.25, 5.0]  # raw, for the metrics


def test_equal_normalised_scores_add_nothing():
    reward = ModelReward("reward_model", Scripted([7.0, 7.0, None]), normalize=True,
                         fallback_reward=-2.0)  # fmt: skip
    assert reward.on_step(_batch(["a", "b", "c"], [1.0, 1.0, 1.0]))["reward"].tolist() == [
        1.0, 1.0, -1.0,
    ]  # fmt: skip


def test_a_failed_call_gives_every_row_of_its_request_the_fallback_and_never_raises():
    error = ModelCallError("judge", 0, 2, "no answer within timeout_s=30 s")
    scorer = Scripted([1.0, 2.0], error, [1.0, 2.0, 3.0])  # the last: one score too many
    reward = ModelReward("judge", scorer, fallback_reward=0.5, max_rows_per_request=2)
    td = reward.on_step(_batch(["a", "b", "c", "d", "e", "f"], [0.0] * 6))
    assert [len(r) for r in scorer.seen] == [2, 2, 2]
    assert td["reward"].tolist() == [1.0, 2.0, 0.5, 0.5, 0.5, 0.5]
    assert td["judge_failed"].tolist() == [False, False, True, True, True, True]


def test_only_the_reply_that_ends_an_episode_is_scored():
    seen: list[str] = []

    def scorer(requests):
        seen.extend(r["response"] for r in requests)
        return [10.0] * len(requests)

    env = tool_env(epochs=1, transforms=[ModelReward("judge", scorer, max_turns=3)])
    policy, state, ended = CallingPolicy(), env.reset(), 0
    while state is not None:
        transition = env.step(policy(state))
        done = transition["done"]
        assert transition["reward"].tolist() == (10.0 * done.float()).tolist()
        assert transition["judge_score"].tolist() == (10.0 * done.float()).tolist()
        ended += int(done.sum())
        going_on = (~done).nonzero().flatten()
        state = transition["next"][going_on] if len(going_on) else None
        if state is None and ended < len(CALLS):
            state = env.reset()
    assert ended == len(CALLS) == len(seen)
    assert seen.count("CALL") == 1  # the episode cut off by max_turns ends on a tool call


def test_a_reply_cut_off_by_the_token_limit_ends_its_episode():
    td = _batch(["a", "b"], [0.0, 0.0])
    td.set("tool_called", torch.tensor([True, True]))
    chats = td.get(("history", "full")).to_chats()
    chats[1][-1]["is_complete"] = False
    td.set("history", ChatHistory(full=History.from_chats(chats), batch_size=[2]))
    td = ModelReward("judge", Scripted([3.0])).on_step(td)
    assert td["reward"].tolist() == [0.0, 3.0]


def test_names_are_the_two_roles():
    with pytest.raises(ValueError, match=r"name must be one of \['reward_model', 'judge'\]"):
        ModelReward("teacher", Scripted())
