"""``topology.weight_transport`` picks the trainer's weight updater; bad values name the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmrl.topology import Topology
from llmrl.transports import (
    BroadcastWeightUpdater,
    RayObjectStoreWeightUpdater,
    VLLMFileWeightUpdater,
    VLLMNCCLWeightUpdater,
)
from llmrl.transports.selection import make_weight_updater

ACTORS, ENGINES = ["front-0", "front-1"], ["engine-0", "engine-1"]


@pytest.mark.parametrize(
    ("transport", "engines", "cuda", "expected"),
    [
        ("auto", [], False, RayObjectStoreWeightUpdater),
        ("auto", ENGINES, False, RayObjectStoreWeightUpdater),  # today's CPU choice
        ("auto", ENGINES, True, VLLMNCCLWeightUpdater),
        ("object_store", ENGINES, True, RayObjectStoreWeightUpdater),
        ("broadcast", [], False, BroadcastWeightUpdater),
        ("vllm", ENGINES, False, VLLMFileWeightUpdater),
        ("vllm", ENGINES, True, VLLMNCCLWeightUpdater),
    ],
)
def test_each_transport_is_chosen_by_configuration(transport, engines, cuda, expected):
    updater = make_weight_updater(transport, ACTORS, engines, 1, "10.0.0.1", cuda=cuda)
    assert type(updater) is expected
    if expected is BroadcastWeightUpdater:
        assert updater.backend == "gloo" and updater.address == "10.0.0.1"
    if expected in (VLLMFileWeightUpdater, VLLMNCCLWeightUpdater):
        assert updater.engines == ENGINES and updater.fronts == ACTORS, "versions reach fronts"
    else:
        assert updater.inference_actors == ACTORS


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
