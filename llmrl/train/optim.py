"""AdamW with linear warmup then a constant, linear or cosine decay."""

from __future__ import annotations

import math

import torch

from llmrl.config.common import OptimizerConfig


def build_optimizer(
    model: torch.nn.Module, config: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and its learning-rate schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    # The fused kernel updates all tensors in one pass (CPU and CUDA; what transformers'
    # Trainer uses by default too).
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay, fused=fused
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config, total_steps)
    )


def lr_factor(step: int, config: OptimizerConfig, total_steps: int) -> float:
    """Multiplier of ``config.lr`` at ``step`` (0-based)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    span = max(1, total_steps - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.min_lr_ratio
    if config.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
