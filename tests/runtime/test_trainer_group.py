"""Trainer ranks on Ray with torch.distributed (gloo): DDP and FSDP2 with two ranks make the
same update as one process on the same batch, in one pass or in micro-batches, and a dead rank
is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensordict import TensorDict, lazy_stack

from llmrl.collectors import LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.envs.task_env import TaskEnv
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import TransformersWrapper
from llmrl.runtime import TrainerGroup, TrainerRankDied, split_groups
from llmrl.topology import Topology, place_on_ray
from llmrl.train.stage import prepared_task
from tests.train.conftest import stage_config

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=90)]

LR = 1e-4
WEIGHT_TOLERANCE = 1e-2 * LR
"""Largest weight difference allowed between world sizes after one AdamW step of ``LR``
(measured: 3e-3 * LR for DDP).

Adam's first step moves each weight by about ``LR * g / (|g| + 1e-8)``; the reduction order
changes gradients by float32 rounding, which moves weights whose gradient is within rounding of
0 by a fraction of ``LR``. Adam's step hides a uniform scale of the gradient, so the gradient
norm (compared to 1e-4 relative) is what catches a wrong per-rank weighting.
"""


def _config(data: Path, model: Path, tmp_path: Path) -> GRPOConfig:
    return stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model}",
        f"optimizer.lr={LR}",
        "optimizer.grad_clip=1000",  # no clipping: the norm is compared as computed
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
        "checkpoint.best_metric=null",
        "runtime.torch_threads=1",
        prompts_per_step=4,
        num_samples=2,
    )


def _topology(ranks: int, strategy: str) -> Topology:
    return Topology.model_validate(
        {
            "inference": {"backend": "transformers", "cpus_per_engine": 0.1},
            "env_workers": {"count": 0},
            "trainer": {"gpus": 0, "ranks": ranks, "strategy": strategy, "cpus": 1.0},
        }
    )


@pytest.fixture(scope="module")
def batch(arithmetic_data, tiny_model_dir):
    """4 groups x 2 responses of different lengths, sampled by the tiny model, with hand-set
    advantages (its rewards are all 0)."""
    task, _ = prepared_task(arithmetic_data)
    env = TaskEnv(task, task.generate(8, seed=0), batch_size=2, repeats=2, seed=0)
    model = load_model(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    rows = []
    for length in (12, 12, 5, 3):  # the random model never stops: lengths set per group
        policy = TransformersWrapper(
            model, tokenizer, generate_kwargs={"max_new_tokens": length, "seed": 0}
        )
        rows += next(iter(LLMCollector(env, policy, dialog_turns_per_batch=4)))[:2].unbind(0)
    collected = lazy_stack(rows)
    collected.set("advantage", torch.tensor([1.0, -1.0, 0.5, -0.5, -2.0, 2.0, 0.3, -0.3]))
    lengths = [len(r) for r in collected["tokens"].as_list("response")]
    assert len(set(lengths)) > 1, lengths  # uneven shards: the per-rank weighting matters
    return collected


def _train_once(config, ranks, strategy, batch, tmp_path) -> tuple[dict, dict]:
    """One step on ``ranks`` ranks; the metrics and the saved weights."""
    topology = _topology(ranks, strategy)
    with place_on_ray(topology, timeout_s=30) as placement:
        group = TrainerGroup(config, topology, placement)
        try:
            metrics = group.train(batch, step=1)
            path = group.save(1, extra={}, metrics={})
        finally:
            group.shutdown()
    return metrics, load_file(Path(path) / "model" / "model.safetensors")


def test_ddp_and_fsdp_with_two_ranks_update_like_one_process(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    single_metrics, single = _train_once(config, 1, "single", batch, tmp_path / "single")
    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    moved = max(float((single[k] - start[k]).abs().max()) for k in single)
    assert moved == pytest.approx(LR, rel=0.05)  # the step did move weights by ~LR
    for strategy in ("ddp", "fsdp"):
        metrics, weights = _train_once(config, 2, strategy, batch, tmp_path / strategy)
        assert metrics["loss"] == pytest.approx(single_metrics["loss"], rel=1e-5, abs=1e-7)
        assert metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=1e-4)
        assert metrics["ESS"] == pytest.approx(single_metrics["ESS"], rel=1e-5)
        assert set(weights) == set(single)
        worst = max(float((weights[k] - single[k]).abs().max()) for k in single)
        assert worst <= WEIGHT_TOLERANCE, (strategy, worst)


def test_micro_batches_on_two_uneven_ranks_update_like_one_process(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    micro = config.model_copy(update={"micro_batch_size": 1})
    three_groups = batch[:6]  # ranks get 4 and 2 rows: 4 passes each, 2 of them stand-ins
    assert [s.batch_size[0] for s, _ in split_groups(three_groups, 2, 2)] == [4, 2]
    single_metrics, single = _train_once(config, 1, "single", three_groups, tmp_path / "single")
    for strategy in ("ddp", "fsdp"):
        metrics, weights = _train_once(micro, 2, strategy, three_groups, tmp_path / strategy)
        assert metrics["loss"] == pytest.approx(single_metrics["loss"], rel=1e-5, abs=1e-7)
        assert metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=1e-4)
        worst = max(float((weights[k] - single[k]).abs().max()) for k in single)
        assert worst <= WEIGHT_TOLERANCE, (strategy, worst)


def test_split_groups_gives_whole_groups_and_stand_ins(batch):
    shards = split_groups(batch, group_size=2, parts=3)  # 4 groups over 3 ranks: 1, 2, 1
    assert [(s.batch_size[0], stand_in) for s, stand_in in shards] == [
        (2, False),
        (4, False),
        (2, False),
    ]
    shards = split_groups(batch[:4], group_size=2, parts=3)  # 2 groups over 3 ranks
    assert [(s.batch_size[0], stand_in) for s, stand_in in shards] == [
        (2, False),
        (2, True),
        (2, False),
    ]
    with pytest.raises(ValueError, match="group 2 of the batch has 1 trajectories, not a whole"):
        split_groups(batch[:3], group_size=2, parts=2)
    with pytest.raises(ValueError, match="a batch of 3 rows is not made of whole groups of 2"):
        split_groups(batch[:3].exclude("group_id"), group_size=2, parts=2)


def test_split_groups_keeps_multi_turn_groups_whole():
    # 3 groups of 2 trajectories: 3, 2 and 4 rows (one row per turn)
    groups = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    trajs = [0, 1, 0, 2, 3, 4, 5, 4, 4]
    batch = TensorDict(
        {"group_id": torch.tensor(groups), "traj_id": torch.tensor(trajs)}, [len(groups)]
    )
    shards = split_groups(batch, group_size=2, parts=2)  # groups 0, 1 | 2
    assert [(s["group_id"].tolist(), stand_in) for s, stand_in in shards] == [
        ([0, 0, 0, 1, 1], False),
        ([2, 2, 2, 2], False),
    ]
    shards = split_groups(batch[:3], group_size=2, parts=2)  # one group, two ranks
    assert [(s["traj_id"].tolist(), stand_in) for s, stand_in in shards] == [
        ([0, 1, 0], True),
        ([0, 1, 0], False),
    ]


def test_a_rank_with_no_group_trains_a_stand_in_with_weight_zero(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    one_group = batch[:2]
    single, single_weights = _train_once(config, 1, "single", one_group, tmp_path / "one")
    pair, pair_weights = _train_once(config, 2, "ddp", one_group, tmp_path / "two")
    assert pair["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    worst = max(float((pair_weights[k] - single_weights[k]).abs().max()) for k in single_weights)
    assert worst <= WEIGHT_TOLERANCE


def test_a_killed_rank_is_named_and_the_others_are_stopped(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    import ray

    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    topology = _topology(2, "ddp")
    with place_on_ray(topology, timeout_s=30) as placement:
        group = TrainerGroup(config, topology, placement)
        ray.kill(group.ranks[1])
        with pytest.raises(TrainerRankDied, match=r"trainer rank 1 died during train"):
            group.train(batch, step=1)
        for rank in group.ranks:  # rank 0 was stopped rather than left in a collective
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(rank.rendezvous.remote(), timeout=30)
        group.shutdown()
