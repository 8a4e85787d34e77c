"""The model a trainer trains: loaded in its master dtype, with LoRA adapters and activation
checkpointing as the stage config asks (SFT, every GRPO trainer rank and the benchmarks build
it here, so they hold the same thing)."""

from __future__ import annotations

import torch

from llmrl.config.common import LoraSettings, ModelConfig
from llmrl.models.activation_checkpointing import enable_activation_checkpointing
from llmrl.train.lora import apply_lora
from llmrl.train.precision import TrainingPrecision


def load_trainable_model(model: ModelConfig, lora: LoraSettings) -> torch.nn.Module:
    """``model.spec`` loaded on ``model.device`` for training (see :func:`make_trainable`)."""
    from llmrl.models import load_model

    precision = TrainingPrecision.of(model)
    loaded = load_model(
        model.spec,
        dtype=precision.load_dtype(lora.enabled),
        device=model.device,
        **model.load_options,
    )
    return make_trainable(loaded, model, lora)


def make_trainable(
    module: torch.nn.Module, model: ModelConfig, lora: LoraSettings
) -> torch.nn.Module:
    """``module`` ready to train as ``model`` and ``lora`` say: parameters in the master dtype
    (:class:`~llmrl.train.precision.TrainingPrecision`; a LoRA base stays in ``model.dtype``),
    LoRA adapters (float32 under mixed precision), activation checkpointing when on, eval mode
    (no dropout: sampling and training log-probs see the same network)."""
    precision = TrainingPrecision.of(model)
    module = module.to(precision.load_dtype(lora.enabled))
    module = apply_lora(module, lora, float32_adapters=precision.mixed)
    if model.checkpoints_activations:
        enable_activation_checkpointing(module)
    return module.eval()
