"""Ray inference actors (transformers engines) verify every push: after one through the object
store or the broadcast, the checksum each reports of the weights it holds is the trainer's; one
whose checksum does not match is refused and the actor's weights and version stay as they were."""

from __future__ import annotations

import pytest

from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum
from llmrl.models import tiny_model
from llmrl.transports import BroadcastWeightUpdater, PackedStateDict, RayObjectStoreWeightUpdater
from tests.support.factories import TinyPolicyFactory, perturbed
from tests.support.ray_local import actor_runtime_env

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def actors(local_ray, session_cache, tokenizer):
    from llmrl.collectors import InferenceActor

    options = {
        "num_cpus": 0.5,
        "max_concurrency": 2,
        "runtime_env": actor_runtime_env(session_cache),
    }
    handles = [
        ray.remote(InferenceActor)
        .options(**options)
        .remote(policy_factory=TinyPolicyFactory(seed=0))
        for _ in range(2)
    ]
    ray.get([actor.ready.remote() for actor in handles])
    yield handles
    for actor in handles:
        ray.kill(actor)


def held(actors) -> list[str]:
    return ray.get([actor.held_checksum.remote() for actor in actors])


def versions(actors) -> list[int]:
    return [info["version"] for info in ray.get([a.info.remote() for a in actors])]


def test_object_store_push_leaves_every_engine_holding_the_trainers_weights(actors, tokenizer):
    trainer = perturbed(tiny_model(tokenizer, seed=0), seed=1)
    expected = weights_checksum(trainer.state_dict())
    assert held(actors) != [expected] * 2
    stats = RayObjectStoreWeightUpdater(actors).push(trainer, version=1)
    assert stats.checksum == expected
    assert stats.engine_checksums == (expected, expected)
    assert held(actors) == [expected] * 2 and versions(actors) == [1, 1]


def test_a_push_whose_checksum_does_not_match_is_refused(actors, tokenizer):
    before, before_versions = held(actors), versions(actors)
    other = PackedStateDict.pack(perturbed(tiny_model(tokenizer, seed=0), seed=2).state_dict())
    with pytest.raises(WeightChecksumError, match="does not match the sender's"):
        ray.get(actors[0].load_state_dict.remote(other, 5, before[0]))
    assert held(actors) == before and versions(actors) == before_versions


def test_broadcast_push_over_gloo_reaches_every_actor(actors, tokenizer):
    trainer = perturbed(tiny_model(tokenizer, seed=0), seed=3)
    expected = weights_checksum(trainer.state_dict())
    updater = BroadcastWeightUpdater(actors, backend="gloo", bucket_bytes=1 << 20, timeout_s=60)
    try:
        stats = updater.push(trainer, version=2)
        assert stats.checksum == expected and stats.engine_checksums == (expected, expected)
        assert held(actors) == [expected] * 2 and versions(actors) == [2, 2]
        again = updater.push(perturbed(trainer, seed=4), version=3)  # the group is reused
        assert again.engine_checksums == (again.checksum,) * 2 != stats.engine_checksums
    finally:
        updater.close()
