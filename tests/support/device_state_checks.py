"""What ``distributed.device_state_dict`` must give, checked the same way on the CPU
(tests/train/test_device_state_dict.py) and on CUDA (tests/gpu/test_device_state_dict_gpu.py)."""

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


def check_own_tensors(model: torch.nn.Module) -> None:
    """A plain model gives its own tensors, on its device, without a copy."""
    device = next(model.parameters()).device
    state = distributed.device_state_dict(model)
    own = model.state_dict()
    assert state.keys() == own.keys()
    for name, tensor in state.items():
        assert tensor.device == device, name
        assert tensor.data_ptr() == own[name].data_ptr(), f"{name} was copied"
        assert not tensor.requires_grad


def check_merged_lora(tokenizer, device: str) -> None:
    """A LoRA model gives the merged weights under the base names, on its device."""
    model = apply_lora(tiny_model(tokenizer, seed=2), LoraSettings(enabled=True, r=4)).to(device)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)  # B starts at zero: make the adapters count
    state = distributed.device_state_dict(model)
    merged = merged_state_dict(model)
    assert state.keys() == merged.keys() and not any(".lora_" in n for n in state)
    assert {t.device.type for t in state.values()} == {device}
    base = model.get_base_model().state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(state[q], merged[q])
    assert not torch.equal(state[q], base["model.layers.0.self_attn.q_proj.base_layer.weight"])


def check_fsdp_whole(tokenizer, device: str, backend: str) -> None:
    """Under FSDP2 (one rank of ``backend``) every layer comes back whole, on ``device``."""
    started = distributed.init_group(0, 1, "127.0.0.1", _free_port(), timeout_s=120)
    try:
        assert started == backend
        reference = tiny_model(tokenizer, seed=3)
        expected = {n: t.clone() for n, t in reference.state_dict().items()}
        wrapped = distributed.wrap_model(tiny_model(tokenizer, seed=3).to(device), "fsdp")
        assert distributed.is_fully_sharded(wrapped)
        state = distributed.device_state_dict(wrapped)
    finally:
        distributed.leave_group()
    assert state.keys() == expected.keys()
    for name, tensor in state.items():
        assert type(tensor) is torch.Tensor, f"{name} is still a {type(tensor).__name__}"
        assert tensor.device.type == device, name
        assert torch.equal(tensor.cpu(), expected[name]), name
