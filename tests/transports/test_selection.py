"""``topology.weight_transport`` picks the trainer's weight updater; bad values name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmrl.topology import Topology
from llmrl.transports import (
    BroadcastWeightUpdater,
    RayObjectStoreWeightUpdater,
    VLLMWeightUpdater,
)
from llmrl.transports.selection import engine_weight_backend, make_weight_updater

ACTORS, ENGINES = ["front-0", "front-1"], ["engine-0", "engine-1"]


@pytest.mark.parametrize(
    ("transport", "engines", "cuda", "colocated", "expected", "backend"),
    [
        ("auto", [], False, False, RayObjectStoreWeightUpdater, None),
        ("auto", ENGINES, False, False, RayObjectStoreWeightUpdater, None),  # the CPU choice
        ("auto", ENGINES, True, False, VLLMWeightUpdater, "nccl"),
        ("auto", ENGINES, True, True, VLLMWeightUpdater, "ipc"),
        ("object_store", ENGINES, True, False, RayObjectStoreWeightUpdater, None),
        ("broadcast", [], False, False, BroadcastWeightUpdater, None),
        ("vllm", ENGINES, False, False, VLLMWeightUpdater, "llmrl_file"),
        ("vllm", ENGINES, True, False, VLLMWeightUpdater, "nccl"),
        ("vllm", ENGINES, True, True, VLLMWeightUpdater, "ipc"),
    ],
)
def test_each_transport_is_chosen_by_configuration(
    transport, engines, cuda, colocated, expected, backend
):
    updater = make_weight_updater(
        transport, ACTORS, engines, 2, "10.0.0.1", cuda=cuda, colocated=colocated, rank=1
    )
    assert type(updater) is expected
    if expected is BroadcastWeightUpdater:
        assert updater.backend == "gloo" and updater.address == "10.0.0.1"
    if expected is VLLMWeightUpdater:
        assert updater.engines == ENGINES and updater.fronts == ACTORS, "versions reach fronts"
        assert (updater.backend, updater.ranks_per_engine, updater.rank) == (backend, 2, 1)
        assert updater.master_address == "10.0.0.1"
    else:
        assert updater.inference_actors == ACTORS
    # the engines are built for what the trainer's updater sends
    engine_backend = engine_weight_backend(transport, colocated, cuda)
    assert engine_backend == (backend or "llmrl_file")


def test_broadcast_uses_nccl_on_gpus():
    assert make_weight_updater("broadcast", ACTORS, cuda=True).backend == "nccl"


def test_bad_transport_values_name_the_field():
    with pytest.raises(ValidationError, match=r"weight_transport\n.*'auto'.*'broadcast'"):
        Topology.model_validate({"weight_transport": "nccl"})
    with pytest.raises(ValueError, match=r"^weight_transport: must be one of auto, object_store"):
        make_weight_updater("nccl", ACTORS)
    with pytest.raises(ValueError, match=r"^weight_transport: 'vllm' needs vLLM engines"):
        make_weight_updater("vllm", ACTORS, [])
    with pytest.raises(ValidationError, match=r"weight_transport: 'vllm' pushes straight"):
        Topology.model_validate(
            {"inference": {"backend": "transformers"}, "weight_transport": "vllm"}
        )


def test_the_default_is_auto():
    assert Topology().weight_transport == "auto" == Topology.local_default().weight_transport
