"""Reward shaping in real GRPO steps (the tiny model samples), in-process and on the Ray runtime:
the replies counted as cut off are exactly those that used the whole budget without an end
token, the trained rows carry their loss mask, and the overlong penalty matches the sampled
lengths."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from llmrl.objectives.reward_shaping import overlong_penalty
from llmrl.objectives.token_level import LOSS_MASK_KEY
from llmrl.policies import TransformersWrapper
from tests.support.configs import tiny_grpo_config

BUDGET = 4
SHAPING = (
    f"generation.max_new_tokens={BUDGET}",
    "reward_shaping.truncated=mask",
    "reward_shaping.overlong_buffer={length: 2, penalty: 1.0}",
)


class Recorder:
    """Wraps a composition's ``collect`` and ``train`` (what ``grpo_step`` calls): the env's
    rewards of each round before shaping, and the rows handed to the trainer."""

    def __init__(self, parts: Any) -> None:
        self.collect, self.train = parts.collect, parts.train
        self.raw: list[torch.Tensor] = []
        self.trained: list[TensorDictBase] = []
        parts.collect, parts.train = self._collect, self._train

    def _collect(self, index: int) -> TensorDictBase:
        batch = self.collect(index)
        self.raw.append(batch["reward"].clone())
        return batch

    def _train(self, trained: TensorDictBase, number: int) -> dict[str, float]:
        self.trained.append(trained)
        return self.train(trained, number)


def check_step(
    recorder: Recorder, batch: TensorDictBase, metrics: dict[str, float], eos: set[int]
) -> None:
    """The step's shaping, from the sampled tokens alone."""
    responses = batch["tokens"].as_list("response")
    cut = [len(r) == BUDGET and int(r[-1]) not in eos for r in responses]
    assert any(cut), "the tiny random model should run out of its 4 tokens"
    assert metrics["shaping/truncated_rows"] == sum(cut)
    assert metrics["shaping/masked_rows"] == sum(cut)
    [trained] = recorder.trained
    assert trained[LOSS_MASK_KEY].tolist() == [not c for c in cut]
    lengths = torch.tensor([float(len(r)) for r in responses])
    penalty = overlong_penalty(lengths, BUDGET, 2, 1.0)
    assert batch["reward"].tolist() == pytest.approx((recorder.raw[0] + penalty).tolist())
    assert metrics["shaping/overlong_rows"] == int((lengths > BUDGET - 2).sum())
    assert metrics["shaping/reward_delta_mean"] == pytest.approx(float(penalty.mean()))


def test_in_process_step_masks_the_replies_cut_off_at_the_budget(arithmetic_data, tiny_model_dir):
    from llmrl.runtime.grpo_loop import InProcessGRPO

    grpo = InProcessGRPO(tiny_grpo_config(arithmetic_data, tiny_model_dir, *SHAPING))
    recorder = Recorder(grpo)
    batch, metrics = grpo.step(1)
    check_step(recorder, batch, metrics, grpo.collector.policy.eos_token_ids)


@pytest.mark.integration
@pytest.mark.slow
def test_runtime_step_on_ray_shapes_the_same_way(
    local_ray, arithmetic_data, tiny_model_dir, tiny, tokenizer
):
    from llmrl.runtime import GRPORuntime, resolve_topology
    from llmrl.runtime.ray_cluster import actor_runtime_env

    config = tiny_grpo_config(arithmetic_data, tiny_model_dir, *SHAPING)
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
    try:
        recorder = Recorder(runtime)
        batch, metrics = runtime.step(1)
    finally:
        runtime.shutdown()
    check_step(recorder, batch, metrics, TransformersWrapper(tiny, tokenizer).eos_token_ids)
