"""Merged LoRA weights computed layer by layer: the same numbers as peft's
``merge_and_unload()``, without copying or touching the live model; a LoRA checkpoint loads as a
plain model with the LoRA model's logits."""

from __future__ import annotations

import copy

import pytest
import torch

from llmrl.models import load_model, tiny_model
from llmrl.train.checkpoint import CheckpointPayload, CheckpointWriter
from llmrl.train.lora import inference_state_dict, merged_state_dict


def _lora(tokenizer, **options):
    """The tiny model with q/v adapters whose B is non-zero (so merging changes the weights)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **options)
    model = get_peft_model(tiny_model(tokenizer, seed=1), config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 14, 3]])).logits


def test_merged_weights_equal_merge_and_unload_and_the_model_is_untouched(tokenizer):
    model = _lora(tokenizer)
    before = _snapshot(model)
    merged = merged_state_dict(model)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[name], expected[name]) for name in expected)  # bit for bit
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    base = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    lora = model.get_base_model().model.layers[0].self_attn.q_proj
    by_hand = base + 2.0 * lora.lora_B["default"].weight @ lora.lora_A["default"].weight
    # scale = 8 / 4; B A sums r = 4 products of values <= ~0.1: a few ulp of weights <= ~0.1
    # (~1e-8), while a missing or doubled scale moves elements by ~1e-2
    torch.testing.assert_close(merged[q_proj], by_hand, rtol=0, atol=1e-6)
    after = model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)
    # layers without adapters are the model's own tensors, not copies
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    live = model.get_base_model().model.layers[0].self_attn.k_proj.weight
    assert merged[k_proj].data_ptr() == live.data_ptr()


def test_a_bfloat16_base_merges_in_float32_and_rounds_once(tokenizer):
    # mixed precision: a bf16 base with float32 adapters (peft's autocast_adapter_dtype)
    from llmrl.config.common import LoraSettings, ModelConfig
    from llmrl.train.trainable_model import make_trainable

    settings = LoraSettings(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    model = make_trainable(tiny_model(tokenizer, seed=1), ModelConfig(dtype="bfloat16"), settings)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    assert layer.base_layer.weight.dtype == torch.bfloat16
    assert layer.lora_A["default"].weight.dtype == torch.float32  # the trained masters
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    merged = merged_state_dict(model)["model.layers.0.self_attn.q_proj.weight"]

    base = layer.base_layer.weight
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight  # scale 8 / 4
    assert merged.dtype == torch.bfloat16
    assert torch.equal(merged, (base.float() + delta).to(torch.bfloat16))  # one rounding
    rounded_twice = base + delta.to(torch.bfloat16)  # the delta rounded, then the sum
    assert not torch.equal(merged, rounded_twice)  # the two differ on this layer


def test_inference_weights_are_the_merged_ones_and_leave_the_model_untouched(tokenizer):
    model = _lora(tokenizer)
    before = _snapshot(model)
    weights = inference_state_dict(model)
    merged = merged_state_dict(model)
    assert all(torch.equal(weights[name], merged[name]) for name in merged)
    after = model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_a_lora_variant_is_refused_by_name(tokenizer):
    model = _lora(tokenizer, use_dora=True)
    with pytest.raises(ValueError, match="q_proj: adapter 'default' is a LoRA variant"):
        merged_state_dict(model)


def test_a_lora_checkpoint_is_a_plain_model_saved_without_copying_the_live_one(
    tmp_path, tokenizer, monkeypatch
):
    model = _lora(tokenizer)
    before = _snapshot(model)
    copied = []
    deepcopy = copy.deepcopy

    def spy(value, *args, **kwargs):
        if isinstance(value, torch.nn.Module):
            copied.append(type(value).__name__)
        return deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", spy)
    writer = CheckpointWriter(tmp_path)
    writer.recover()
    path = writer.save(CheckpointPayload(step=1, model=model, tokenizer=tokenizer))
    assert copied == []
    after = model.state_dict()
    assert all(torch.equal(after[name], before[name]) for name in before)
    plain = load_model(path / "model")
    assert type(plain).__name__ == "LlamaForCausalLM"
    assert not any("lora" in name for name, _ in plain.named_parameters())
    # merged against unmerged adapters: sums of <= 128 terms regrouped on logits ~1
    # (summation_atol(1, 128) = 8e-6, as in test_checkpoint.py)
    torch.testing.assert_close(_logits(plain), _logits(model), rtol=0, atol=1e-5)
