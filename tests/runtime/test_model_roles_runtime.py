"""The model roles in the GRPO runtime on a local Ray: a teacher for on-policy distillation, a
judge and a reward model scoring in the env workers, a judge server killed between steps, and
a served judge that is down (every row falls back, counted, and the run goes on)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime import GRPORuntime
from tests.support.configs import tiny_grpo_config
from tests.support.model_role_runs import assert_model_rewards_weighted, role_topology, run_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 2
ROWS = 2 * 2  # prompts_per_step x num_samples


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """Another tiny random Llama (seed 1) over the student's tokenizer: a teacher that disagrees
    with the student on every token."""
    from llmrl.models import tiny_model

    folder = tmp_path_factory.mktemp("teacher")
    tiny_model(tokenizer, seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _engine(model: Path) -> dict:
    return {"model": str(model), "backend": "transformers", "dtype": "float32",
            "cpus_per_engine": 0.25, "memory_gb": 1}  # fmt: skip


def _config(data: Path, model: Path, topology: dict, **fields) -> GRPOConfig:
    return tiny_grpo_config(data, model, topology=topology, **fields)


def _run(config: GRPOConfig, steps: int = STEPS, between=None) -> tuple[list, list, GRPORuntime]:
    return run_steps(config, steps, between)


def test_a_teacher_scores_every_trained_row_once_a_step_and_the_loss_distils(
    local_ray, arithmetic_data, tiny_model_dir, teacher_dir
):
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        role_topology(teacher=_engine(teacher_dir)),
        loss={"distillation": {"coeff": 1.0, "task_weight": 0.0}},
    )
    _, metrics, _ = _run(config)
    assert [m["policy_version"] for m in metrics] == [1, 2]
    # one teacher request per step, with every trained row (no zero-std group is dropped)
    assert [m["teacher/requests"] for m in metrics] == [1.0, 2.0]
    assert [m["teacher/rows"] for m in metrics] == [ROWS, 2 * ROWS]
    assert all(m["teacher/call_failures"] == 0 and m["teacher/latency_s"] > 0 for m in metrics)
    # the loss read the teacher's scores: two random models' log-probs of the same tokens
    # differ (measured 0.039 and 0.012 nats a token; the value itself: test_distillation.py)
    assert all(0 < abs(m["distill_reverse_kl"]) < 1 for m in metrics), metrics


def test_a_judge_and_a_reward_model_score_in_the_env_workers_and_weight_the_reward(
    local_ray, arithmetic_data, tiny_model_dir, tiny_classifier_dir
):
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        role_topology(judge=_engine(tiny_model_dir), reward_model=_engine(tiny_classifier_dir)),
        rewards={
            "task_weight": 0.0,
            "judge": {"weight": 0.5, "min_verdict_prob": 0.0},  # a random judge's mass is tiny
            "reward_model": {"weight": 2.0},
        },
    )
    batches, metrics, _ = _run(config)
    # task_weight 0: the reward is the two models' weighted scores, nothing else
    assert_model_rewards_weighted(batches, metrics, judge=0.5, reward_model=2.0)
    # both env workers' requests reached the one server of each role, every row once
    assert metrics[-1]["judge/rows"] == STEPS * ROWS
    assert metrics[-1]["reward_model/rows"] == STEPS * ROWS
    assert metrics[-1]["judge/requests"] == STEPS * 2  # one per env worker and step


def test_a_killed_judge_server_is_rebuilt_and_the_next_step_is_judged(
    local_ray, arithmetic_data, tiny_model_dir
):
    import ray

    config = _config(
        arithmetic_data,
        tiny_model_dir,
        role_topology(judge=_engine(tiny_model_dir)),
        rewards={"judge": {"weight": 1.0, "timeout_s": 60, "min_verdict_prob": 0.0}},
    )
    killed = []

    def kill_after_first(runtime: GRPORuntime, number: int) -> None:
        if number == 1:
            server = runtime.model_roles.servers["judge"][0]
            ray.kill(server, no_restart=False)  # Ray restarts it (runtime.max_actor_restarts)
            killed.append(server)

    batches, metrics, _ = _run(config, steps=3, between=kill_after_first)
    assert killed and [m["policy_version"] for m in metrics] == [1, 2, 3]
    assert all(not batch["judge_failed"].any() for batch in batches)  # retried on the new one
    # the restarted server counts from zero: it served steps 2 and 3, or part of step 2
    assert metrics[0]["judge/requests"] == 2.0
    assert 2.0 <= metrics[-1]["judge/requests"] <= 4.0


def test_a_served_judge_that_is_down_gives_every_row_the_fallback_and_the_run_goes_on(
    local_ray, arithmetic_data, tiny_model_dir
):
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        role_topology(judge={"url": "http://127.0.0.1:9", "served_model": str(tiny_model_dir)}),
        rewards={
            "task_weight": 0.0,
            "judge": {"weight": 1.0, "timeout_s": 5, "max_retries": 1, "fallback_reward": -0.5},
        },
    )
    batches, metrics, _ = _run(config)
    assert [m["policy_version"] for m in metrics] == [1, 2]
    for batch, step in zip(batches, metrics, strict=True):
        assert batch["judge_failed"].all()
        torch.testing.assert_close(batch["reward"].float(), torch.full((ROWS,), -0.5))
        assert step["judge/failures"] == ROWS
