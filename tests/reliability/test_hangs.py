"""No silent hangs, on a local 2-CPU Ray with the tiny model.

An inference engine stuck in ``load_weights`` during a push, an env worker whose ``collect``
never returns, an engine whose ``generate`` never returns, an engine that never joins the
weight broadcast group, and a trainer rank that never answers the driver's push: each wait
ends within its deadline (``runtime.timeouts``) plus :data:`MARGIN_S`, with a
:class:`~llmrl.core.deadlines.CallTimeout` naming the role, the index, the phase, the version
and the round. A hung engine or env worker is killed and rebuilt while its slot has restarts
left (the push or the batch then completes, nothing lost); with none left the timeout itself
stops the collector.

The margin, from what the code does: every deadline is one ``ray.wait`` whose timeout is what
is left of it (nothing polls); a push's deadline starts before its ``ray.put`` and a collect
round's once its calls are sent, so the clock the test reads starts no later than the code's;
with no restart left the timeout is raised with no Ray call after the wait. What remains is
the scheduler of a loaded 2-core machine (other test workers beside this one): one second.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from llmrl.config.runtime_settings import RuntimeTimeouts
from llmrl.core.deadlines import CallTimeout
from llmrl.models import tiny_model
from tests.reliability.dying_actors import DyingEnvFactory, DyingPolicyFactory
from tests.reliability.hanging_actors import HangingLoadFactory, HangSwitch
from tests.support.factories import ArithmeticEnvFactory, TinyPolicyFactory, perturbed
from tests.support.ray_local import actor_runtime_env

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MARGIN_S = 1.0
TURNS = 8  # a batch: each of 2 workers resets once (2 prompts x 2 samples, one turn each)
# far above a healthy call of the tiny model (a push: ~0.1 s; a collect: ~1 s), short enough
# for a test; an env worker's collect outlasts its engine calls (RuntimeTimeouts' own check)
TIMEOUTS = RuntimeTimeouts(weight_push_s=5, engine_call_s=10, env_worker_s=12, startup_s=120)


@pytest.fixture
def hang_collector(local_ray, session_cache, tokenizer):
    """Builds RayLLMCollectors over 2 env workers and 1 inference actor with :data:`TIMEOUTS`;
    shuts them down (killing whatever still hangs)."""
    from llmrl.collectors import ActorLayout, RayLLMCollector

    made = []

    def make(env_factory: Any, policy_factory: Any, restarts: int = 1) -> RayLLMCollector:
        made.append(
            RayLLMCollector(
                env_factory=env_factory,
                policy_factory=policy_factory,
                actors=ActorLayout.uniform(env_workers=2, inference_actors=1),
                dialog_turns_per_batch=TURNS,
                runtime_env=actor_runtime_env(session_cache),
                max_actor_restarts=restarts,
                timeouts=TIMEOUTS,
            )
        )
        return made[-1]

    yield make
    for collector in made:
        collector.shutdown(close_timeout_s=1.0)


def hang(tmp_path: Path, name: str, at_call: int) -> HangSwitch:
    return HangSwitch(str(tmp_path), name, at_call, times=1)


def batch_of(collector: Any) -> Any:
    """The collector's next batch of :data:`TURNS` transitions."""
    collector.total_dialog_turns = collector.stats["yielded_turns"] + TURNS
    (batch,) = list(collector)
    return batch


def assert_nothing_lost_or_repeated(collector: Any, *batches: Any) -> None:
    """With one more batch (a round may collect past a batch; the rest waits for the next),
    every trajectory id is new, and worker 1's (the odd ids) run on without a gap."""
    batches = (*batches, batch_of(collector))
    ids = [i for batch in batches for i in batch.get("traj_id").tolist()]
    assert len(ids) == len(set(ids)) == len(batches) * TURNS
    assert sorted(i for i in ids if i % 2)[:TURNS] == list(range(1, 2 * TURNS, 2))


def timed(call: Any, *args: Any) -> tuple[Any, float]:
    """``call(*args)``'s result (or the error it raised) and its wall seconds."""
    start = time.monotonic()
    try:
        result = call(*args)
    except CallTimeout as error:
        result = error
    return result, time.monotonic() - start


def test_an_engine_hung_in_load_weights_is_rebuilt_and_the_push_completes(
    hang_collector, tmp_path, tokenizer
):
    switch = hang(tmp_path, "load", at_call=1)
    collector = hang_collector(ArithmeticEnvFactory(), HangingLoadFactory(switch))
    old = collector.inference_actors[0]
    trainer = perturbed(tiny_model(tokenizer, seed=0))

    stats, seconds = timed(collector.update_policy_weights_, trainer)

    assert switch.kills() == 1  # the first engine hung, its replacement loaded
    assert not isinstance(stats, CallTimeout), stats
    assert seconds >= TIMEOUTS.weight_push_s  # it waited out the deadline, then rebuilt
    assert stats.version == 1 and stats.engine_checksums == (stats.checksum,)
    assert collector.metrics()["collector/inference_actor_restarts"] == 1
    engine = collector.inference_actors[0]
    assert engine != old and ray.get(engine.info.remote())["version"] == 1
    batch = batch_of(collector)  # the rebuilt engine samples with the pushed version
    assert batch.get("policy_version").tolist() == [1] * TURNS


def test_an_engine_hung_in_load_weights_with_no_restart_left_stops_the_push(
    hang_collector, tmp_path, tokenizer
):
    switch = hang(tmp_path, "load", at_call=1)
    collector = hang_collector(ArithmeticEnvFactory(), HangingLoadFactory(switch), restarts=0)
    trainer = perturbed(tiny_model(tokenizer, seed=0))

    error, seconds = timed(collector.update_policy_weights_, trainer)

    assert isinstance(error, CallTimeout) and isinstance(error, TimeoutError)
    assert TIMEOUTS.weight_push_s <= seconds <= TIMEOUTS.weight_push_s + MARGIN_S
    assert str(error) == (
        "inference engine 0 hung: load_state_dict / load_weights did not return within 5 s "
        "(phase loading, version 1; bounded by runtime.timeouts.weight_push_s); not rebuilt: "
        "max_actor_restarts=0 spent on inference actor 0"
    )
    assert collector.policy_version == 0  # the push did not happen


def test_an_env_worker_that_never_answers_is_rebuilt_from_its_last_state(hang_collector, tmp_path):
    # worker 1 hangs at its 2nd reset: in the collect of batch 2, after batch 1 reported state
    switch = hang(tmp_path, "env-worker-1", at_call=2)
    collector = hang_collector(DyingEnvFactory(switch, worker_index=1), TinyPolicyFactory())
    first = batch_of(collector)

    second, seconds = timed(batch_of, collector)

    assert switch.kills() == 1 and not isinstance(second, CallTimeout), second
    assert seconds >= TIMEOUTS.env_worker_s
    assert collector.metrics()["collector/env_worker_restarts"] == 1
    # the replacement went on from worker 1's state after batch 1 (its next id 9, the next
    # prompts): nothing lost or repeated
    assert_nothing_lost_or_repeated(collector, first, second)


def test_an_env_worker_that_never_answers_with_no_restart_left_stops_the_batch(
    hang_collector, tmp_path
):
    switch = hang(tmp_path, "env-worker-1", at_call=2)
    collector = hang_collector(
        DyingEnvFactory(switch, worker_index=1), TinyPolicyFactory(), restarts=0
    )
    batch_of(collector)

    error, seconds = timed(batch_of, collector)

    assert isinstance(error, CallTimeout), error
    assert TIMEOUTS.env_worker_s <= seconds <= TIMEOUTS.env_worker_s + MARGIN_S
    assert str(error) == (
        "env worker 1 hung: collect did not return within 12 s (version 0, round 2; bounded "
        "by runtime.timeouts.env_worker_s); not rebuilt: max_actor_restarts=0 spent on env "
        "worker 1"
    )


def test_an_engine_whose_generate_never_returns_is_rebuilt_and_the_batch_completes(
    hang_collector, tmp_path
):
    # batch 1 takes 2 generate calls (one per worker); the engine hangs in the 3rd
    switch = hang(tmp_path, "generate", at_call=3)
    collector = hang_collector(ArithmeticEnvFactory(), DyingPolicyFactory(switch))
    first = batch_of(collector)

    second, seconds = timed(batch_of, collector)

    assert switch.kills() == 1 and not isinstance(second, CallTimeout), second
    assert seconds >= TIMEOUTS.engine_call_s
    metrics = collector.metrics()
    assert metrics["collector/inference_actor_restarts"] == 1
    assert metrics["collector/env_worker_restarts"] == 0  # the worker waited, then retried
    # worker 1's rows waiting for the hung reply were answered by the rebuilt engine
    assert_nothing_lost_or_repeated(collector, first, second)


class Joiner:
    """An inference actor stand-in for the broadcast group: joins, or never does."""

    def __init__(self, joins: bool) -> None:
        self.joins = joins

    def ready(self) -> bool:
        return True

    def join_weight_group(self, membership: Any) -> None:
        if not self.joins:
            time.sleep(3600)
        self.group = membership.join()


def test_an_engine_that_never_joins_the_broadcast_group_is_named(local_ray):
    from llmrl.transports.broadcast import BroadcastWeightUpdater

    actors = [ray.remote(Joiner).options(num_cpus=0).remote(joins) for joins in (True, False)]
    ray.get([actor.ready.remote() for actor in actors])
    updater = BroadcastWeightUpdater(actors, backend="gloo", timeout_s=2.0)
    try:
        error, seconds = timed(updater.init_group, 3)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert isinstance(error, CallTimeout), error
    assert 2.0 <= seconds <= 2.0 + MARGIN_S  # one wait of the store for every member's key
    assert str(error) == (
        "weight broadcast hung: joining the group did not return within 2 s (phase joining, "
        "version 3, ranks this rank 0 of 3 (rank 0 sends); bounded by "
        "runtime.collective_timeout_s); rank(s) 2 did not join; rank r of the group is "
        "inference engine r - 1"
    )


class Sleeper:
    """A trainer rank stand-in whose call never returns."""

    def push_weights(self, version: int) -> None:
        time.sleep(3600)


def test_a_trainer_rank_that_never_answers_a_push_stops_the_ranks_naming_it(local_ray):
    from llmrl.runtime.trainer_group import TrainerGroup

    group = TrainerGroup.__new__(TrainerGroup)  # the driver's wait alone, over one stand-in
    group.ranks = [ray.remote(Sleeper).options(num_cpus=0).remote()]
    call = group.ranks[0].push_weights.remote(4)

    error, seconds = timed(group._wait, [call], "push_weights", [0], False, (2.0, 4))

    assert isinstance(error, CallTimeout), error
    assert 2.0 <= seconds <= 2.0 + MARGIN_S
    assert str(error) == (
        "trainer rank 0 hung: push_weights did not return within 2 s (version 4; bounded by "
        "runtime.timeouts.weight_push_s + runtime.collective_timeout_s); the ranks were "
        "stopped; re-run to resume"
    )
    with pytest.raises(ray.exceptions.RayActorError):  # killed with the group
        ray.get(call, timeout=30)
