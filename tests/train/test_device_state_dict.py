"""``distributed.device_state_dict``: what vLLM's GPU weight-transfer engines send, on every rank
and on the rank's own device (``full_state_dict`` gives rank 0 a CPU copy instead)."""

from __future__ import annotations

import socket

import torch

from llmrl.config.common import LoraSettings
from llmrl.models import tiny_model
from llmrl.train import distributed
from llmrl.train.lora import apply_lora, merged_state_dict


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_plain_model_gives_its_own_tensors_without_a_copy(tokenizer):
    model = tiny_model(tokenizer, seed=1)
    state = distributed.device_state_dict(model)
    own = model.state_dict()
    assert state.keys() == own.keys()
    for name, tensor in state.items():
        assert tensor.data_ptr() == own[name].data_ptr(), f"{name} was copied"
        assert not tensor.requires_grad


def test_a_lora_model_gives_the_merged_weights_under_the_base_names(tokenizer):
    model = apply_lora(tiny_model(tokenizer, seed=2), LoraSettings(enabled=True, r=4))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)  # B starts at zero: make the adapters count
    state = distributed.device_state_dict(model)
    merged = merged_state_dict(model)
    assert state.keys() == merged.keys() and not any(".lora_" in n for n in state)
    base = model.get_base_model().state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(state[q], merged[q])
    assert not torch.equal(state[q], base["model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_fsdp_gives_every_layer_whole(tokenizer):
    distributed.init_group(0, 1, "127.0.0.1", _free_port(), timeout_s=60)  # gloo on CPU
    try:
        reference = tiny_model(tokenizer, seed=3)
        expected = {n: t.clone() for n, t in reference.state_dict().items()}
        wrapped = distributed.wrap_model(tiny_model(tokenizer, seed=3), "fsdp")
        assert distributed.is_fully_sharded(wrapped)
        state = distributed.device_state_dict(wrapped)
    finally:
        distributed.leave_group()
    assert state.keys() == expected.keys()
    for name, tensor in state.items():
        assert type(tensor) is torch.Tensor, f"{name} is still a {type(tensor).__name__}"
        assert torch.equal(tensor, expected[name]), name
