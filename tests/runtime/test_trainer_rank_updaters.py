"""Which trainer ranks hold a weight updater: rank 0 always; every rank for vLLM's ``ipc``
engine (colocated), where each rank shares its own GPU's copy with the engine worker on it."""

from __future__ import annotations

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime.trainer_rank import TrainerRank
from llmrl.transports import RayObjectStoreWeightUpdater, VLLMWeightUpdater

ENGINES, FRONTS = ["engine-0", "engine-1"], ["front-0", "front-1"]


def rank(number: int) -> TrainerRank:
    return TrainerRank(
        config=GRPOConfig.model_validate({"data": {"path": "data/prepared/unused"}}),
        rank=number,
        world_size=2,
        strategy="ddp",
        total_optimizer_steps=1,
        reference_with_trainer=False,
    )


@pytest.mark.parametrize(
    ("transport", "engines", "colocated", "backends"),
    [
        ("vllm", ENGINES, True, ("ipc", "ipc")),  # every rank takes part
        ("vllm", ENGINES, False, ("llmrl_file", None)),  # no GPU here: the file backend
        ("auto", ENGINES, False, ("object_store", None)),
        ("object_store", [], False, ("object_store", None)),
    ],
)
def test_ranks_hold_the_updaters_their_transport_needs(transport, engines, colocated, backends):
    held = []
    for number in (0, 1):
        trainer = rank(number)
        trainer.connect_engines(FRONTS, engines, 2, transport, colocated)
        held.append(trainer.weight_updater)
        # vLLM's GPU engines send every rank's own device copy; the others rank 0's CPU copy
        assert trainer.push_from_device is (backends[0] == "ipc")
    for number, (updater, backend) in enumerate(zip(held, backends, strict=True)):
        if backend is None:
            assert updater is None, f"rank {number} pushes nothing"
        elif backend == "object_store":
            assert isinstance(updater, RayObjectStoreWeightUpdater)
        else:
            assert isinstance(updater, VLLMWeightUpdater)
            assert (updater.backend, updater.rank, updater.ranks_per_engine) == (
                backend,
                number,
                2,
            )
            assert updater.engines == ENGINES and updater.fronts == FRONTS
