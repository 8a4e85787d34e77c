"""Optional LoRA adapters through peft."""

from __future__ import annotations

import torch

from llmrl.config.common import LoraSettings
from llmrl.models.errors import MissingExtraError


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters when ``settings.enabled`` (else return it as is)."""
    if not settings.enabled:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingExtraError("peft", "local", "LoRA training") from None
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def inference_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an inference engine loads: the model's own state dict, or for a LoRA model
    the base model's names with the adapters merged in (computed on a merged view, then the
    adapters are unmerged so training continues on them)."""
    if not hasattr(model, "merge_adapter"):
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    model.merge_adapter()
    try:
        return {
            name.replace(".base_layer", ""): tensor.detach().cpu().clone()
            for name, tensor in model.get_base_model().state_dict().items()
            if ".lora_" not in name
        }
    finally:
        model.unmerge_adapter()
