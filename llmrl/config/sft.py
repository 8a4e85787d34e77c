"""The ``sft`` stage's config: supervised fine-tuning on the prepared dataset's targets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmrl.config.common import CheckpointConfig, LoraSettings, OptimizerConfig, StageConfig


class SFTConfig(StageConfig):
    """Settings of ``llmrl sft``.

    Example (YAML)::

        data: {path: data/prepared/arithmetic-0123456789abcdef}
        steps: 100
        batch_size: 8
        optimizer: {lr: 2.0e-5, warmup_steps: 10}
    """

    output_dir: str = Field("runs/sft", description="where checkpoints and outputs go")
    steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(8, ge=1, description="examples per micro-batch")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    max_length: int = Field(512, ge=8, description="drop examples longer than this (tokens)")
    loss_function: Literal["sft", "minor_sft"] = Field("sft", description="SFT objective")
    normalize_by_seq_length: bool = Field(
        False, description="average the NLL per sequence first, then over sequences"
    )
    eval_every: int = Field(25, ge=1, description="evaluate the loss on eval rows every N steps")
    eval_batches: int = Field(4, ge=1, description="eval micro-batches per evaluation")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=2e-5, warmup_steps=5),
        description="optimizer and schedule",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="optional LoRA")
    checkpoint: CheckpointConfig = Field(
        default_factory=lambda: CheckpointConfig(best_metric="eval_loss", best_mode="min"),
        description="checkpoints and resume",
    )
