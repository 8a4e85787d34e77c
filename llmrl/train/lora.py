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
