"""PackedStateDict: the object-store form of pushed weights (numpy, shared tensors once)."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from llmrl.transports.packed_weights import PackedStateDict


def tied_state() -> dict[str, torch.Tensor]:
    embedding = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    return {
        "embed.weight": embedding,
        "norm.weight": torch.tensor([0.5, -1.25, 3.0], dtype=torch.bfloat16),
        "lm_head.weight": embedding,  # tied: the same tensor under a second name
        "layer.weight": torch.arange(6, dtype=torch.float32).reshape(3, 2).t(),  # not contiguous
    }


def test_round_trip_is_bit_identical_and_stores_tied_tensors_once() -> None:
    state = tied_state()
    packed = PackedStateDict.pack(state)
    assert set(packed.arrays) == {"embed.weight", "norm.weight", "layer.weight"}
    assert packed.aliases == {"lm_head.weight": "embed.weight"}
    assert packed.views == {"norm.weight": "bfloat16"}
    assert packed.nbytes == 12 * 4 + 3 * 2 + 6 * 4  # the tied 12 floats counted once
    # what Ray does to it: pickle protocol 5 (the arrays go out of band)
    buffers: list[pickle.PickleBuffer] = []
    wire = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 3, "every array travels out of band, none inside the pickle"
    restored = pickle.loads(wire, buffers=buffers).unpack()
    assert set(restored) == set(state)
    for name, tensor in state.items():
        assert restored[name].dtype == tensor.dtype and restored[name].shape == tensor.shape
        assert torch.equal(restored[name], tensor), name
    assert restored["lm_head.weight"] is restored["embed.weight"]


def test_unpacked_tensors_share_the_arrays_memory() -> None:
    packed = PackedStateDict.pack({"w": torch.ones(3)})
    packed.arrays["w"].setflags(write=False)  # as ray.get returns them: read-only, no copy
    tensor = packed.unpack()["w"]
    assert tensor.data_ptr() == packed.arrays["w"].__array_interface__["data"][0]
    model = torch.nn.Linear(3, 1, bias=False)
    model.load_state_dict({"weight": packed.unpack()["w"].reshape(1, 3)})
    assert torch.equal(model.weight, torch.ones(1, 3))


def test_empty_tensors_are_not_taken_for_aliases() -> None:
    packed = PackedStateDict.pack({"a": torch.empty(0), "b": torch.empty(0)})
    assert set(packed.arrays) == {"a", "b"} and not packed.aliases
    assert isinstance(packed.arrays["a"], np.ndarray)
