"""The trainer side of the ``llmrl_file`` weight-transfer backend, without vLLM: the file it
writes (the worker side is tested against a real engine in tests/vllm)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from llmrl.data.sources import sha256_file
from llmrl.policies.vllm_file_transfer import write_weights


def test_weights_are_written_once_per_storage_and_read_back_exactly(tmp_path):
    embed = torch.randn(5, 3)
    pairs = [
        ("model.embed_tokens.weight", embed),
        ("lm_head.weight", embed),  # tied: the same storage under a second name
        ("model.norm.weight", torch.arange(3, dtype=torch.bfloat16)),
        ("model.layers.0.mlp.down_proj.weight", torch.randn(4, 6).t()),  # not contiguous
    ]
    path = write_weights(pairs, tmp_path)
    assert path.parent == tmp_path and path.name.startswith("llmrl-weights-")
    back = load_file(path)
    assert sorted(back) == sorted(name for name, _ in pairs if name != "lm_head.weight")
    for name, tensor in pairs[:1] + pairs[2:]:
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    # the checksum the worker compares: a changed byte changes it
    digest = sha256_file(path)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert sha256_file(path) != digest


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    import safetensors.torch

    def half_written(state, name):
        with open(name, "wb") as stream:
            stream.write(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(OSError, match="No space left"):
        write_weights([("a", torch.zeros(2))], tmp_path)
    assert list(tmp_path.iterdir()) == []
