"""ActorLayout: how many actors a RayLLMCollector runs and each one's Ray options (no Ray)."""

from __future__ import annotations

import pytest

from llmrl.collectors import ActorLayout


def test_a_uniform_layout_gives_every_actor_the_same_fractional_resources():
    layout = ActorLayout.uniform(env_workers=3, inference_actors=2, inference_gpus=1)
    assert len(layout.inference) == 2 and len(layout.env_workers) == 3
    runtime = {"runtime_env": {"env_vars": {"A": "1"}}}
    # inference actor 0 serves workers 0 and 2: their calls and a weight load at once
    assert layout.inference_options(1, runtime) == {
        "num_cpus": 0.5,
        "num_gpus": 1,
        "max_concurrency": 3,
        **runtime,
    }
    assert layout.env_worker_options(2, {}) == {"num_cpus": 0.5}


def test_placed_actors_keep_their_own_options_per_slot():
    layout = ActorLayout(
        inference=({"num_cpus": 0.0, "scheduling_strategy": "engine0"},),
        env_workers=({"num_cpus": 1, "scheduling_strategy": "w0"}, {"num_cpus": 2}),
    )
    assert layout.inference_options(0, {})["scheduling_strategy"] == "engine0"
    assert layout.inference_options(0, {})["max_concurrency"] == 3
    assert layout.env_worker_options(1, {"runtime_env": {}}) == {"num_cpus": 2, "runtime_env": {}}


@pytest.mark.parametrize(("workers", "actors"), [(0, 1), (2, 0)])
def test_a_collector_needs_an_actor_of_each_kind(workers: int, actors: int):
    with pytest.raises(ValueError, match="must be >= 1"):
        ActorLayout.uniform(env_workers=workers, inference_actors=actors)
    with pytest.raises(ValueError, match="at least one inference actor and one env worker"):
        ActorLayout(inference=({"num_cpus": 1},) * actors, env_workers=({"num_cpus": 1},) * workers)
