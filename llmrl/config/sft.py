"""The ``sft`` stage's config: supervised fine-tuning on the prepared dataset's targets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config.common import CheckpointConfig, LoraSettings, OptimizerConfig, StageConfig
from llmrl.core.config_loading import MAX_BATCH, MAX_STEPS, MAX_TOKENS

DEFAULT_MINOR_SFT_BETA = 0.1
"""MinorSFT's ``beta`` when ``minor_sft_beta`` is not set."""


class SFTConfig(StageConfig):
    """Settings of ``llmrl sft``.

    Example (YAML)::

        data: {path: data/prepared/arithmetic-0123456789abcdef}
        steps: 100
        batch_size: 8
        optimizer: {lr: 2.0e-5, warmup_steps: 10}
    """

    output_dir: str = Field("runs/sft", description="where checkpoints and outputs go")
    steps: int = Field(100, ge=1, le=MAX_STEPS, description="optimizer steps")
    batch_size: int = Field(8, ge=1, le=MAX_BATCH, description="examples per micro-batch")
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH, description="micro-batches per optimizer step")
    max_length: int = Field(
        512, ge=8, le=MAX_TOKENS, description="drop examples longer than this (tokens)"
    )
    loss_function: Literal["sft", "minor_sft"] = Field(
        "sft",
        description="sft: NLL of the assistant tokens; minor_sft: MinorSFT, "
        "-log sigmoid(beta * (log p - log p_ref)), needs `reference: true`",
    )
    minor_sft_beta: float | None = Field(
        None,
        gt=0,
        description=f"MinorSFT's beta (loss_function: minor_sft only); null: "
        f"{DEFAULT_MINOR_SFT_BETA}",
    )
    reference: bool = Field(
        False,
        description="score every batch with a frozen reference, the starting model (with LoRA: "
        "the model with its adapters off, no second copy), for minor_sft and kl_to_ref_coeff; "
        "its KL is logged as kl_to_ref",
    )
    kl_to_ref_coeff: float = Field(
        0.0, ge=0, description="weight of a k3 KL-to-reference term (needs `reference: true`)"
    )
    normalize_by_seq_length: bool = Field(
        False, description="average the NLL per sequence first, then over sequences"
    )
    eval_every: int = Field(
        25, ge=1, le=MAX_STEPS, description="evaluate the loss on eval rows every N steps"
    )
    eval_batches: int = Field(
        4, ge=1, le=MAX_BATCH, description="eval micro-batches per evaluation"
    )
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=2e-5, warmup_steps=5),
        description="optimizer and schedule",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="optional LoRA")
    checkpoint: CheckpointConfig = Field(
        default_factory=lambda: CheckpointConfig(best_metric="eval_loss", best_mode="min"),
        description="checkpoints and resume",
    )

    @property
    def beta(self) -> float:
        """MinorSFT's beta (the default when ``minor_sft_beta`` is not set)."""
        return DEFAULT_MINOR_SFT_BETA if self.minor_sft_beta is None else self.minor_sft_beta

    @model_validator(mode="after")
    def _reference_needed(self) -> SFTConfig:
        problems = self.model.training_problems()
        if problems:
            raise ValueError("\n".join(problems))
        if self.loss_function == "minor_sft" and not self.reference:
            raise ValueError(
                "loss_function: 'minor_sft' compares the model with a frozen reference model; "
                "set `reference: true` (or loss_function: sft)"
            )
        if self.kl_to_ref_coeff > 0 and not self.reference:
            raise ValueError("kl_to_ref_coeff > 0 needs `reference: true`")
        if self.minor_sft_beta is not None and self.loss_function != "minor_sft":
            raise ValueError(
                "minor_sft_beta is MinorSFT's temperature; set loss_function: minor_sft (or "
                "remove minor_sft_beta)"
            )
        return self
