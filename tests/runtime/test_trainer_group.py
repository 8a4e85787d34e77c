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
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import TransformersWrapper
from llmrl.runtime import TrainerGroup, TrainerRankDied, split_groups
from llmrl.topology import Topology, place_on_ray
from llmrl.train.micro_batches import sequence_lengths
from tests.support.configs import stage_config
from tests.support.stages import first_update_loss_atol

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LR = 1e-4
ADAM_EPS = 1e-8  # torch's AdamW default, llmrl's too


def assert_same_update(weights: dict, single: dict, start: dict) -> None:
    """``weights`` made the one-process update ``single - start`` of one AdamW step of ``LR``,
    to the bound float rounding allows.

    Adam's first step moves a weight by ``-LR * phi(g)``, ``phi(g) = g / (|g| + eps)``. Another
    reduction order changes ``g`` by float32 rounding, which moves ``phi`` by at most
    ``eps * |dg| / |g|^2``; wherever the gradient keeps its sign (|dg| < |g|) that is at most
    ``eps / |g|``. Where the one-process step moved a weight by at least ``(1 - 1e-3) * LR``,
    ``|g| >= 999 eps`` and the two updates differ by at most ``1e-3 * LR`` (plus the rounding of
    the stored weight, 2 ulps). Elsewhere ``g`` is within rounding of 0 and its sign may flip:
    at most ``2 * LR``. (Adam hides a uniform scale of the gradient, so the callers compare the
    gradient norm to catch a wrong per-rank weighting.)
    """
    assert set(weights) == set(single)
    saturated_count = moved_count = 0
    for name, moved in ((k, single[k] - start[k]) for k in single):
        saturated = moved.abs() >= (1 - 1e-3) * LR
        rounding = 2 * torch.finfo(torch.float32).eps * single[name].abs()
        bound = torch.where(saturated, 1e-3 * LR, 2 * LR) + rounding
        excess = (weights[name] - single[name]).abs() - bound
        assert float(excess.max()) <= 0, (name, float(excess.max()))
        if "embed_tokens" not in name:  # the tied output layer: most of its |g| are tiny
            saturated_count += int(saturated.sum())
            moved_count += int((moved != 0).sum())
    assert saturated_count > 0.5 * moved_count  # most layer weights meet the tight bound


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
        group = TrainerGroup(config=config, topology=topology, placement=placement)
        try:
            metrics = group.train(batch, step=1)
            path = group.save(1, extra={}, metrics={})
        finally:
            group.shutdown()
    return metrics, load_file(Path(path) / "model" / "model.safetensors")


def _ranks_update_like_one_process(
    ranks_config, one_config, batch, model_dir, tmp_path
) -> tuple[dict, dict, dict, dict[str, dict]]:
    """One step of ``one_config`` in one process, then of ``ranks_config`` on two DDP and on two
    FSDP ranks, each checked to make the one process's update: the same loss, gradient norm and
    weights. Returns the one process's metrics, its weights, the starting weights and each
    strategy's metrics.

    The norm's relative rounding is at most that of its largest element, a sum over the
    vocabulary (grad_logits @ W): eps sqrt(V) = 2.6e-5 per sigma, and rel=1e-4 is ~4 sigmas of
    one scalar; the loss cancels to ~0 (``first_update_loss_atol``)."""
    single_metrics, single = _train_once(one_config, 1, "single", batch, tmp_path / "single")
    start = load_file(Path(model_dir) / "model.safetensors")
    ranked = {}
    for strategy in ("ddp", "fsdp"):
        metrics, weights = _train_once(ranks_config, 2, strategy, batch, tmp_path / strategy)
        loss_atol = first_update_loss_atol(batch)
        assert metrics["loss"] == pytest.approx(single_metrics["loss"], rel=1e-5, abs=loss_atol)
        assert metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=1e-4)
        assert_same_update(weights, single, start)
        ranked[strategy] = metrics
    return single_metrics, single, start, ranked


def test_ddp_and_fsdp_with_two_ranks_update_like_one_process(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    single_metrics, single, start, ranked = _ranks_update_like_one_process(
        config, config, batch, tiny_model_dir, tmp_path
    )
    moved = max(float((single[k] - start[k]).abs().max()) for k in single)
    # Adam's first step: LR |g| / (|g| + eps) <= LR, plus the stored weight's rounding (ulp of
    # weights ~1: 1.2e-7 = 1e-3 LR); 5% tells a step from none or from a scaled one
    assert moved == pytest.approx(LR, rel=0.05)  # the step did move weights by ~LR
    for metrics in ranked.values():  # the ESS of ratios exactly 1 is exactly 1
        assert metrics["ESS"] == pytest.approx(single_metrics["ESS"], rel=1e-5)


def test_micro_batches_on_two_uneven_ranks_update_like_one_process(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    micro = config.model_copy(update={"micro_batch_size": 1})
    three_groups = batch[:6]  # ranks get 4 and 2 rows: 4 passes each, 2 of them stand-ins
    assert [s.batch_size[0] for s, _ in split_groups(three_groups, 2, 2)] == [4, 2]
    _ranks_update_like_one_process(micro, config, three_groups, tiny_model_dir, tmp_path)


def test_packed_ranks_in_token_budgets_update_like_one_padded_process(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    """Packed rows (activation checkpointing on, as on CUDA, so no rank shares prompts: every
    forward packs), token-budget micro-batches and token-balanced shards, on DDP and FSDP ranks:
    the update of one process scoring padded rows in one pass."""
    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    checkpointed = config.model.model_copy(update={"activation_checkpointing": True})
    padded_model = checkpointed.model_copy(update={"packing": False})
    padded = config.model_copy(update={"model": padded_model})
    lengths = sequence_lengths(batch)
    budget = 2 * max(lengths)  # 2-3 rows a pass, the 8 rows in 3-4 passes per rank
    packed = config.model_copy(update={"model": checkpointed, "max_tokens_per_micro_batch": budget})
    shards = split_groups(batch, 2, 2, by_tokens=True)
    tokens = [sum(sequence_lengths(shard)) for shard, _ in shards]
    assert abs(tokens[0] - tokens[1]) <= max(lengths) * 2  # within one group of each other
    _ranks_update_like_one_process(packed, padded, batch, tiny_model_dir, tmp_path)


def test_fsdp_ranks_in_bfloat16_keep_float32_masters_and_save_bfloat16(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    from llmrl.train.checkpoint import read_training_state

    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    config = config.model_copy(
        update={"model": config.model.model_copy(update={"dtype": "bfloat16"})}
    )
    single_metrics, _ = _train_once(config, 1, "single", batch, tmp_path / "single")
    topology = _topology(2, "fsdp")  # FSDP2's MixedPrecisionPolicy instead of autocast
    with place_on_ray(topology, timeout_s=30) as placement:
        group = TrainerGroup(config=config, topology=topology, placement=placement)
        try:
            metrics = group.train(batch, step=1)
            path = Path(group.save(1, extra={}, metrics={}))
        finally:
            group.shutdown()
    saved = load_file(path / "model" / "model.safetensors")
    masters = read_training_state(path)["master_weights"]
    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    moved_by_lr = total = 0
    for name, weight in saved.items():
        assert masters[name].dtype == torch.float32
        assert torch.equal(weight, masters[name].to(torch.bfloat16)), name
        # Adam's first step moves a weight whose |g| >> eps by LR exactly: only float32 holds
        # that (bfloat16 near these weights can move only in steps of ~1e-4 * 2^k)
        if "embed_tokens" not in name:  # the tied output layer: most of its |g| are tiny
            step = (masters[name] - start[name]).abs()
            moved_by_lr += int(((step - LR).abs() <= 1e-3 * LR).sum())
            total += step.numel()
    assert moved_by_lr > 0.5 * total
    # bfloat16 compute on both sides, cast in different places (autocast keeps norms in float32,
    # FSDP's policy does not): a few 2^-8 roundings apart, far from a missing 2x of the ranks
    assert metrics["grad_norm"] == pytest.approx(single_metrics["grad_norm"], rel=5e-2)
    assert metrics["peak_memory_mb"] > 0


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
    assert pair["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)  # ~4 sigma, above
    start = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert_same_update(pair_weights, single_weights, start)


def test_a_killed_rank_is_named_and_the_others_are_stopped(
    local_ray, arithmetic_data, tiny_model_dir, batch, tmp_path
):
    import ray

    config = _config(arithmetic_data, tiny_model_dir, tmp_path)
    topology = _topology(2, "ddp")
    with place_on_ray(topology, timeout_s=30) as placement:
        group = TrainerGroup(config=config, topology=topology, placement=placement)
        ray.kill(group.ranks[1])
        with pytest.raises(TrainerRankDied, match=r"trainer rank 1 died during train"):
            group.train(batch, step=1)
        for rank in group.ranks:  # rank 0 was stopped rather than left in a collective
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(rank.rendezvous.remote(), timeout=30)
        group.shutdown()
