"""LLMCollector: batch sizes and totals, policy versions, multi-turn trajectories kept whole and
in order, replay-buffer mode, checkpoints, exhausted datasets."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from llmrl.collectors import LLMCollector
from llmrl.data.replay import ReplayBuffer
from llmrl.envs import ArithmeticEnv, PolicyVersion
from llmrl.policies import TransformersWrapper
from llmrl.transports import InProcessWeightUpdater
from tests.support.scripted import CallingPolicy, tool_env


def _trajectories(batches) -> dict[int, list]:
    """traj_id -> its rows, in the order they were yielded (checked contiguous)."""
    found: dict[int, list] = {}
    for batch in batches:
        ids = batch.get("traj_id").tolist()
        for index, traj in enumerate(ids):
            assert traj not in found or ids[index - 1] == traj, "a trajectory is split"
            found.setdefault(traj, []).append(batch[index])
    return found


def test_tiny_model_batches_totals_and_policy_versions(tiny, tokenizer):
    env = ArithmeticEnv(batch_size=2, repeats=2, num_problems=10)
    policy = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 4})
    collector = LLMCollector(env, policy, dialog_turns_per_batch=6, total_dialog_turns=12)
    batches = []
    for batch in collector:
        batches.append(batch)
        collector.update_policy_weights_()
    # single-turn env, 4 rows a reset: 6 = one reset and a half, no trajectory split
    assert [b.batch_size[0] for b in batches] == [6, 6]
    # the version of the weights that replied: the 2 rows left over from the second reset
    # were generated before the update
    assert [b.get("policy_version").tolist() for b in batches] == [[0] * 6, [0, 0, 1, 1, 1, 1]]
    assert collector.policy_version == 2
    assert collector.stats == {"turns": 12, "trajectories": 12, "batches": 2, "yielded_turns": 12}
    ids = torch.cat([b.get("traj_id") for b in batches]).tolist()
    assert ids == list(range(12))
    first = batches[0]
    assert first.get("turn").tolist() == [0] * 6 and first.get("done").all()
    assert first.get("group_id").tolist() == [0, 0, 1, 1, 2, 2]
    assert all(len(r) > 0 for r in first.get("tokens").as_list("response"))
    assert list(collector) == [], "total_dialog_turns reached: nothing more"


def test_multi_turn_trajectories_are_yielded_whole_once_and_in_order():
    policy = CallingPolicy()
    collector = LLMCollector(tool_env(), policy, dialog_turns_per_batch=5, total_dialog_turns=16)
    batches = list(collector)
    assert sum(b.batch_size[0] for b in batches) == 16
    assert all(b.batch_size[0] >= 5 for b in batches)
    trajectories = _trajectories(batches)
    assert sorted(trajectories) == list(range(8)), "every trajectory exactly once"
    expected_turns = [1, 3, 2, 2, 3, 1, 1, 3]
    for traj, rows in trajectories.items():
        assert [int(r.get("turn")) for r in rows] == list(range(expected_turns[traj]))
        assert [bool(r.get("done")) for r in rows] == [False] * (len(rows) - 1) + [True]
        assert {r.get_non_tensor("prompt_id") for r in rows} == {f"p{traj}"}
        for turn, row in enumerate(rows):  # the prompt grows by one exchange a turn
            prompt = row.get(("history", "prompt")).to_chats()
            assert sum(m["role"] == "assistant" for m in prompt) == turn
    last = trajectories[4][-1]
    assert bool(last.get("truncated")) and not bool(last.get("terminated"))
    assert bool(trajectories[1][-1].get("terminated"))
    # the env steps only the rows still going: 4, 3, 1 rows, then 4, 2, 2
    assert policy.calls == [4, 3, 1, 4, 2, 2]
    assert collector.stats["trajectories"] == 8 and collector.stats["turns"] == 16


def test_trajectories_finishing_on_the_same_step_are_all_yielded():
    # a batch per step: the two 2-turn trajectories end together on step 2
    collector = LLMCollector(tool_env(), CallingPolicy(), dialog_turns_per_batch=1)
    batches = iter(collector)
    assert next(batches).get("traj_id").tolist() == [0]
    assert next(batches).get("traj_id").tolist() == [2, 2]
    assert next(batches).get("traj_id").tolist() == [3, 3]
    assert next(batches).get("traj_id").tolist() == [1, 1, 1]


def test_transitions_as_they_come_without_waiting_for_trajectories():
    collector = LLMCollector(
        tool_env(),
        CallingPolicy(),
        dialog_turns_per_batch=3,
        total_dialog_turns=9,
        yield_completed_trajectories=False,
    )
    batches = list(collector)
    assert [b.batch_size[0] for b in batches] == [3, 3, 3]
    # collection order: turn 0 of rows 0-3, turn 1 of rows 1-3, turn 2 of row 1, then turn 0
    turns = [t for b in batches for t in b.get("turn").tolist()]
    assert turns == [0, 0, 0, 0, 1, 1, 1, 2, 0]


def test_replay_buffer_mode_fills_the_buffer():
    buffer = ReplayBuffer(seed=0)
    collector = LLMCollector(
        tool_env(), CallingPolicy(), 8, total_dialog_turns=16, replay_buffer=buffer
    )
    counts = list(collector)
    assert counts == [8, 8]
    assert len(buffer) == 16
    assert sorted(set(buffer.sample(16).get("traj_id").tolist())) == list(range(8))


def test_env_policy_version_transform_is_the_version_source():
    version = PolicyVersion()
    collector = LLMCollector(tool_env(transforms=[version]), CallingPolicy(), 4)
    batches = iter(collector)
    assert set(next(batches).get("policy_version").tolist()) == {0}
    collector.update_policy_weights_()
    assert version.version == 1 and collector.policy_version == 1
    second = next(batches)
    # a trajectory in flight during the update: each turn carries the version that replied
    versions = dict.fromkeys(second.get("traj_id").tolist(), ())
    for traj, turn_version in zip(
        second.get("traj_id").tolist(), second.get("policy_version").tolist(), strict=True
    ):
        versions[traj] += (turn_version,)
    assert versions == {1: (0, 0, 1), 5: (1,)}


def test_weight_updater_is_called_and_weights_need_one(tiny, tokenizer):
    policy = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 2})
    env = ArithmeticEnv(batch_size=1, num_problems=4)
    updater = InProcessWeightUpdater(policy, source=tiny)
    collector = LLMCollector(env, policy, 1, weight_updater=updater)
    stats = collector.update_policy_weights_()
    assert stats.version == 1 and stats.bytes == 0, "same model: nothing copied"
    assert updater.history == [stats]
    with pytest.raises(ValueError, match="no weight_updater"):
        LLMCollector(env, policy, 1).update_policy_weights_(tiny.state_dict())


def test_checkpoint_resumes_at_the_same_prompts():
    collector = LLMCollector(tool_env(), CallingPolicy(), 4)
    batches = iter(collector)
    next(batches)
    state = collector.state_dict()
    assert state["policy_version"] == 0 and state["stats"]["batches"] == 1
    collector.update_policy_weights_()
    state = collector.state_dict()
    resumed = LLMCollector(tool_env(), CallingPolicy(), 4)
    resumed.load_state_dict(state)
    assert resumed.policy_version == 1 and resumed.stats == collector.stats
    # the trajectory in flight is not saved: the resumed collector starts at the next reset
    again = next(iter(resumed))
    assert set(again.get("prompt_id").tolist()) <= {"p4", "p5", "p6", "p7"}
    assert again.get("traj_id").min() >= state["next_traj_id"] == 4
    fresh = next(iter(LLMCollector(tool_env(), CallingPolicy(), 4)))
    assert "p0" in fresh.get("prompt_id").tolist()


def test_exhausted_dataset_ends_collection_with_what_is_left():
    collector = LLMCollector(tool_env(epochs=1), CallingPolicy(), dialog_turns_per_batch=10)
    batches = list(collector)
    assert sum(b.batch_size[0] for b in batches) == 16
    assert [b.batch_size[0] for b in batches][-1] <= 10


def test_policies_sampling_several_replies_per_prompt_are_refused(tiny, tokenizer):
    policy = TransformersWrapper(
        tiny, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 2}
    )
    collector = LLMCollector(ArithmeticEnv(batch_size=1, num_problems=2), policy, 1)
    with pytest.raises(ValueError, match="repeats"):
        next(iter(collector))


def test_invalid_settings():
    with pytest.raises(ValueError, match="total_dialog_turns"):
        LLMCollector(tool_env(), CallingPolicy(), 4, total_dialog_turns=0)
    with pytest.raises(ValueError, match="dialog_turns_per_batch"):
        LLMCollector(tool_env(), CallingPolicy(), 0)


def test_importing_collectors_imports_neither_ray_nor_vllm():
    code = (
        "import sys, llmrl.collectors, llmrl.data.replay; "
        "print(sorted({'ray', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
