"""The inference actor's torch work beside its model calls runs on passing threads (in process,
without Ray): a thread that ends takes its OpenMP team with it, so the policy's decode keeps
spin-waiting between its parallel regions (see ``on_passing_thread``)."""

from __future__ import annotations

import threading

import pytest

from llmrl.collectors import ray_actors
from llmrl.collectors.ray_actors import InferenceActor, on_passing_thread
from llmrl.core.weights_checksum import weights_checksum
from llmrl.models import load_tokenizer, tiny_model
from llmrl.transports.packed_weights import PackedStateDict
from tests.support.factories import TinyPolicyFactory, perturbed


def test_on_passing_thread_returns_the_value_from_a_thread_that_has_ended() -> None:
    seen: list[threading.Thread] = []

    def work(a: int, b: int) -> int:
        seen.append(threading.current_thread())
        return a + b

    assert on_passing_thread(work, 2, 3) == 5
    assert seen[0] is not threading.current_thread()
    assert not seen[0].is_alive()


def test_on_passing_thread_raises_the_functions_error_in_the_caller() -> None:
    def fail() -> None:
        raise KeyError("missing weight")

    with pytest.raises(KeyError, match="missing weight"):
        on_passing_thread(fail)


def test_inference_actor_loads_and_checksums_weights_on_passing_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[threading.Thread] = []
    load_into = ray_actors._load_into

    def recording(*args):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return load_into(*args)

    monkeypatch.setattr(ray_actors, "_load_into", recording)
    actor = InferenceActor(policy_factory=TinyPolicyFactory(), engine=0)
    try:
        trained = perturbed(tiny_model(load_tokenizer(), seed=0)).state_dict()
        sent = weights_checksum(trained)
        held = actor.load_state_dict(PackedStateDict.pack(trained), version=3, checksum=sent)
        assert held == sent == actor.held_checksum()
        assert actor.version == 3
        assert threads and threads[0] is not threading.current_thread()
        assert not threads[0].is_alive()
    finally:
        actor.policy.close()
