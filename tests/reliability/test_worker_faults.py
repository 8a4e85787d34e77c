"""Worker faults: Ray actors killed mid-batch, and Prefect stage tasks whose launcher fails.

Ray (local, 2 CPUs, the tiny model): an env worker or the inference actor is ``SIGKILL``-ed
mid-batch (:mod:`tests.reliability.dying_actors`); the collector rebuilds it, the batch comes
out whole, and ``collector/*_restarts`` counts exactly the kills. An actor that keeps dying
fails the batch with an error naming it.

Prefect (test harness): the real pipeline flow with a launcher that fails once with a
transient error completes after a retry; a config error fails the flow at the first attempt,
with its message in the flow run's state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flows.launchers import StageConfigError, TransientStageError
from flows.pipeline import PipelineParams, pipeline
from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from tests.reliability.dying_actors import DyingEnvFactory, DyingPolicyFactory, KillSwitch
from tests.support.factories import ArithmeticEnvFactory, TinyPolicyFactory, perturbed
from tests.support.prefect_harness import FlakyLauncher
from tests.support.ray_local import actor_runtime_env

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TURNS = 16  # a batch: each of 2 workers resets twice (2 prompts x 2 samples, one turn each)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_collector(local_ray, session_cache, tokenizer):
    """Builds RayLLMCollectors over 2 env workers and 1 inference actor; shuts them down."""
    from llmrl.collectors import ActorLayout, RayLLMCollector

    made = []

    def make(env_factory: Any, policy_factory: Any, **options: Any) -> RayLLMCollector:
        collector = RayLLMCollector(
            env_factory=env_factory,
            policy_factory=policy_factory,
            actors=ActorLayout.uniform(env_workers=2, inference_actors=1),
            dialog_turns_per_batch=TURNS,
            total_dialog_turns=TURNS,
            runtime_env=actor_runtime_env(session_cache),
            **options,
        )
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.shutdown()


def switch(tmp_path: Path, name: str, at_call: int, times: int = 1) -> KillSwitch:
    return KillSwitch(str(tmp_path), name, at_call, times)


def next_batch(collector: Any) -> Any:
    """The next batch of ``TURNS`` transitions (the collector stops after it)."""
    collector.total_dialog_turns = collector.stats["yielded_turns"] + TURNS
    (batch,) = list(collector)
    return batch


def restarts(collector: Any) -> tuple[float, float]:
    metrics = collector.metrics()
    return metrics["collector/env_worker_restarts"], metrics["collector/inference_actor_restarts"]


def test_env_worker_killed_mid_batch_is_rebuilt_from_its_last_state(make_collector, tmp_path):
    # worker 1 dies at its 2nd env reset, inside a collect call, twice: in batch 1 before it
    # ever returned (the replacement starts afresh), in batch 2 after it returned (the
    # replacement starts from its reported state)
    kill = switch(tmp_path, "env-worker-1", at_call=2, times=2)
    collector = make_collector(DyingEnvFactory(kill, worker_index=1), TinyPolicyFactory())

    first = next_batch(collector)
    assert kill.kills() == 1
    assert first.batch_size[0] == TURNS and first.get("done").all()
    ids = first.get("traj_id").tolist()
    # round 1: worker 0 finished 8 (ids 0..14), worker 1 died; round 2: 4 each, the
    # replacement of worker 1 starting again at id 1
    assert sorted(i for i in ids if i % 2 == 0) == list(range(0, 24, 2))
    assert sorted(i for i in ids if i % 2 == 1) == [1, 3, 5, 7]
    assert restarts(collector) == (1.0, 0.0)

    second = next_batch(collector)
    assert kill.kills() == 2
    ids_2 = second.get("traj_id").tolist()
    assert second.batch_size[0] == TURNS and len(set(ids + ids_2)) == 2 * TURNS
    # the second replacement resumed after the prompts its predecessor had drawn (ids 1..7)
    assert min(i for i in ids_2 if i % 2 == 1) == 9
    assert restarts(collector) == (2.0, 0.0)
    assert collector.stats["batches"] == 2 and collector.stats["yielded_turns"] == 2 * TURNS


def test_inference_actor_killed_mid_batch_comes_back_with_the_pushed_weights(
    make_collector, tmp_path, tokenizer
):
    # batch 1 takes 4 generate calls (2 per worker); the actor dies at the 6th, in batch 2
    kill = switch(tmp_path, "inference-0", at_call=6)
    collector = make_collector(ArithmeticEnvFactory(), DyingPolicyFactory(kill))
    next_batch(collector)
    trainer = perturbed(tiny_model(tokenizer, seed=0))
    collector.update_policy_weights_(trainer)
    old_actor = collector.inference_actors[0]

    batch = next_batch(collector)
    assert kill.kills() == 1
    assert batch.batch_size[0] == TURNS and batch.get("done").all()
    assert batch.get("policy_version").tolist() == [1] * TURNS
    assert restarts(collector) == (0.0, 1.0)

    actor = collector.inference_actors[0]
    assert actor is not old_actor and collector.weight_updater.inference_actors == [actor]
    assert ray.get(actor.info.remote())["version"] == 1
    local = TransformersWrapper(trainer, tokenizer).get_new_version(generate=False)
    expected = local(batch).get("log_probs").as_list("full")
    scored = ray.get(actor.score.remote(batch)).get("log_probs").as_list("full")
    # the same weights, forward and shapes in another process on the same CPU: bitwise equal
    # (assert_close's fp32 defaults would allow a few ulp of |log p| ~ 12)
    for got, want in zip(scored, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_an_env_worker_that_keeps_dying_fails_with_its_name(make_collector, tmp_path):
    from llmrl.collectors.actor_faults import ActorRestartsExhausted

    kill = switch(tmp_path, "env-worker-1", at_call=1, times=99)
    collector = make_collector(
        DyingEnvFactory(kill, worker_index=1), TinyPolicyFactory(), max_actor_restarts=2
    )
    with pytest.raises(ActorRestartsExhausted) as failure:
        next_batch(collector)
    message = str(failure.value)
    assert message.startswith(
        "env worker 1 died 3 times, more than max_actor_restarts=2 allows; giving up "
        "(last error: ActorDiedError: "
    )
    assert kill.kills() == 3
    assert restarts(collector) == (2.0, 0.0)


# ---------------------------------------------------------------- Prefect stage retries


@pytest.fixture
def eval_only(tmp_path: Path) -> PipelineParams:
    """Pipeline params that run one stage, ``eval-base`` (the others are given or skipped),
    with the flow's own retry settings (``retries`` default 2) and no retry delay."""
    given = tmp_path / "given"
    given.mkdir()
    return PipelineParams(
        eval_config=str(REPO / "configs/eval.yaml"),
        start_from={"prepare": str(given)},
        skip=["sft", "grpo"],
        work_dir=str(tmp_path / "work"),
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        retry_delay_s=0,
    )


@pytest.fixture
def run_flow(prefect_api, eval_only, monkeypatch):
    """Runs the real pipeline flow over ``eval_only`` with the given launcher; returns its
    final state."""

    def run(launcher: FlakyLauncher) -> Any:
        monkeypatch.setattr("flows.pipeline.make_launcher", lambda _: launcher)
        return pipeline(eval_only, return_state=True)

    return run


def stage_task_runs(flow_run_id: Any, name: str) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterName,
    )
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        return client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])),
            sort=TaskRunSort.ID_DESC,  # Prefect 3.8's server rejects the client's nulls
            limit=10,
        )


def test_a_transient_launcher_error_is_retried_by_the_flow(run_flow):
    launcher = FlakyLauncher(TransientStageError("eval-base", "API answered 503"), failures=1)
    state = run_flow(launcher)
    assert state.is_completed()
    assert launcher.calls == 2
    summary = state.result()
    assert [s["name"] for s in summary["stages"]] == ["prepare", "eval-base"]
    assert summary["evaluation"][0]["accuracy"] == 0.5
    (task_run,) = stage_task_runs(state.state_details.flow_run_id, "eval-base")
    assert task_run.run_count == 2 and task_run.state.is_completed()


def test_a_stage_config_error_fails_the_flow_at_the_first_attempt(run_flow):
    launcher = FlakyLauncher(StageConfigError("eval-base", "batch_size: must be > 0"), failures=9)
    state = run_flow(launcher)
    assert state.is_failed()
    assert launcher.calls == 1
    error = state.result(raise_on_failure=False)
    assert isinstance(error, StageConfigError)
    assert str(error) == "eval-base: batch_size: must be > 0"
    assert "eval-base: batch_size: must be > 0" in state.message
    (task_run,) = stage_task_runs(state.state_details.flow_run_id, "eval-base")
    assert task_run.run_count == 1 and task_run.state.is_failed()
