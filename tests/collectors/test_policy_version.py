"""The policy version lives in one place, the weight transport (``weight_updater.version``):
the collector, the env's PolicyVersion transform, the background rollouts and the samples all
read it, so no push, checkpoint load or updater swap can set them apart, and the readers refuse
to keep a version of their own."""

from __future__ import annotations

import pytest
import torch

from llmrl.collectors import AsyncRollouts, LLMCollector
from llmrl.envs import PolicyVersion
from llmrl.transports import InProcessWeightUpdater, VersionOnlyUpdater
from tests.support.scripted import CallingPolicy, tool_env


def readers(collector: LLMCollector, transform: PolicyVersion, rollouts: AsyncRollouts) -> set:
    return {
        collector.weight_updater.version,
        collector.policy_version,
        transform.version,
        rollouts.policy_version,
    }


def test_every_reader_sees_the_transports_version():
    transform = PolicyVersion()
    updater = InProcessWeightUpdater(torch.nn.Linear(2, 2), source=torch.nn.Linear(2, 2))
    collector = LLMCollector(
        tool_env(transforms=[transform]), CallingPolicy(), 4, 12, None, updater
    )
    rollouts = AsyncRollouts(collector, max_staleness=0)
    assert readers(collector, transform, rollouts) == {0}
    seen = []
    for batch in rollouts:
        seen.append((updater.version, batch.get("policy_version").tolist()))
        stats = rollouts.update_policy_weights_()
        assert stats.version == updater.version
        assert readers(collector, transform, rollouts) == {stats.version}
    rollouts.shutdown()
    assert [version for version, _ in seen] == [0, 1, 2]
    for version, stamped in seen:  # on-policy: every sample carries the version that made it
        assert set(stamped) <= {version - 1, version} and version in stamped
    updater.push(version=10)  # a push from elsewhere (a resume): everyone follows
    assert readers(collector, transform, rollouts) == {10}


def test_loads_and_swaps_move_the_one_version():
    transform = PolicyVersion()
    collector = LLMCollector(tool_env(transforms=[transform]), CallingPolicy(), 4)
    assert isinstance(collector.weight_updater, VersionOnlyUpdater)
    collector.update_policy_weights_()
    state = collector.state_dict()
    collector.load_state_dict({**state, "policy_version": 7})
    assert collector.weight_updater.version == transform.version == 7
    replacement = InProcessWeightUpdater(torch.nn.Linear(2, 2))
    collector.weight_updater = replacement  # the new transport continues from the version
    assert replacement.version == collector.policy_version == transform.version == 7


def test_readers_keep_no_version_of_their_own():
    transform = PolicyVersion(version=3)  # an env that starts further on
    collector = LLMCollector(tool_env(transforms=[transform]), CallingPolicy(), 4)
    assert collector.weight_updater.version == 3 == transform.version
    with pytest.raises(RuntimeError, match="follows its collector's version"):
        transform.version = 5
    with pytest.raises(RuntimeError, match="set the version there"):
        transform.increment()
    assert not hasattr(collector, "_counter")
