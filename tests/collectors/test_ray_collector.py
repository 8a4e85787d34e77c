"""RayLLMCollector on a local 2-CPU Ray: two env workers and one inference actor (the tiny
model) yield the requested transitions; weights pushed through the object store reach the
actor, which then scores like the trainer."""

from __future__ import annotations

import pytest
import torch

from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from tests.support.factories import ArithmeticEnvFactory, TinyPolicyFactory, perturbed
from tests.support.ray_local import actor_runtime_env

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration


@pytest.fixture
def collector(local_ray, session_cache, tokenizer):  # tokenizer: cached before the actors load it
    """A fresh collector for each test (each one consumes it; one pushes weights to it), so no
    test depends on what another left: batches of 8 dialog turns, 16 in all."""
    from llmrl.collectors import ActorLayout, RayLLMCollector

    collector = RayLLMCollector(
        env_factory=ArithmeticEnvFactory(batch_size=2, repeats=2, num_problems=10),
        policy_factory=TinyPolicyFactory(seed=0, min_batch_size=8),  # 2 workers x 2 x 2 rows
        actors=ActorLayout.uniform(env_workers=2, inference_actors=1),
        dialog_turns_per_batch=8,
        total_dialog_turns=16,
        runtime_env=actor_runtime_env(session_cache),
    )
    yield collector
    collector.shutdown()


def test_two_env_workers_yield_the_requested_transitions(collector):
    batches = list(collector)
    assert [b.batch_size[0] for b in batches] == [8, 8]
    ids = torch.cat([b.get("traj_id") for b in batches]).tolist()
    assert len(set(ids)) == 16, "trajectory ids are unique across workers"
    assert {i % 2 for i in ids} == {0, 1}, "both workers contributed"
    for batch in batches:
        assert batch.get("policy_version").tolist() == [0] * 8
        assert batch.get("done").all() and batch.get("turn").tolist() == [0] * 8
        assert all(len(r) > 0 for r in batch.get("tokens").as_list("response"))
    assert collector.stats["batches"] == 2 and collector.stats["yielded_turns"] == 16
    info = ray.get(collector.inference_actors[0].info.remote())
    assert info["generate_calls"] == 4
    assert info["model_calls"] < info["generate_calls"], "concurrent workers share model calls"


def test_object_store_weights_reach_the_inference_actor(collector, tokenizer):
    collector.total_dialog_turns = 8  # one batch
    (batch,) = list(collector)
    actor = collector.inference_actors[0]
    trainer = perturbed(tiny_model(tokenizer, seed=0))
    local = TransformersWrapper(trainer, tokenizer).get_new_version(generate=False)
    expected = local(batch).get("log_probs").as_list("full")

    def remote_scores():
        return ray.get(actor.score.remote(batch)).get("log_probs").as_list("full")

    before = remote_scores()
    # another random model: log-probs differ by O(1), far beyond allclose's default tolerance
    assert not any(torch.allclose(a, b) for a, b in zip(before, expected, strict=True))

    stats = collector.update_policy_weights_(trainer)
    assert stats.version == 1 and collector.policy_version == 1
    distinct = {t.data_ptr(): t for t in trainer.state_dict().values()}.values()  # tied: once
    assert stats.bytes == sum(t.numel() * t.element_size() for t in distinct)
    # the same weights, forward and shapes in another process on the same CPU: bitwise equal
    # (measured 0; assert_close's fp32 defaults would allow a few ulp of |log p| ~ 12)
    for got, want in zip(remote_scores(), expected, strict=True):
        torch.testing.assert_close(got, want)
    assert ray.get(actor.info.remote())["version"] == 1 == collector.weight_updater.version
    assert stats.engine_checksums == (stats.checksum,), "the actor holds what was sent"

    collector.total_dialog_turns += 8
    (after,) = list(collector)
    assert after.get("policy_version").tolist() == [1] * 8
    state = collector.state_dict()
    assert state["policy_version"] == 1 and len(state["workers"]) == 2
