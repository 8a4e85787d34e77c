"""The ``grpo`` stage's config: group-relative policy optimisation on a task's reward."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.config.common import (
    CheckpointConfig,
    GenerationSettings,
    LoraSettings,
    OptimizerConfig,
    StageConfig,
)
from llmrl.config.loading import ConfigModel


class GRPOLossSettings(ConfigModel):
    """Options of :class:`llmrl.objectives.GRPOLoss`."""

    clip_epsilon: float | tuple[float, float] = Field(
        0.2, description="symmetric clip, or (eps_low, eps_high) for DAPO clip-higher"
    )
    kl_to_ref_coeff: float = Field(0.0, ge=0, description="k3 KL to the reference model")
    kl_to_inference_coeff: float = Field(0.0, ge=0, description="k3 KL to the sampling policy")
    entropy_coeff: float = Field(0.0, ge=0, description="entropy bonus")
    aggregation: Literal["token_mean", "prompt_mean", "sum_norm"] = Field(
        "token_mean", description="how per-token losses become one number"
    )
    masking_strategy: Literal["sft", "rlhf", "generic"] = Field(
        "sft", description="which tokens are trained: response, all assistant, all"
    )
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling cap (None: off)"
    )


class AdvantageSettings(ConfigModel):
    """Options of :class:`llmrl.objectives.MCAdvantage`."""

    scale: Literal["group", "batch", "none"] = Field(
        "group", description="divide by the group std, the batch std, or nothing (Dr. GRPO)"
    )
    drop_zero_std: bool = Field(
        False, description="drop groups whose rewards are all equal (dynamic sampling)"
    )


class GRPOConfig(StageConfig):
    """Settings of ``llmrl grpo``: each step samples ``prompts_per_step`` prompts x
    ``num_samples`` responses, computes group-relative advantages, runs ``updates_per_step``
    optimizer steps over them and syncs the weights to the sampling engine.

    Example (YAML)::

        data: {path: data/prepared/arithmetic-0123456789abcdef}
        model: {checkpoint: runs/sft/checkpoints/step-000100/model}
        steps: 50
        num_samples: 4
    """

    output_dir: str = Field("runs/grpo", description="where checkpoints and outputs go")
    steps: int = Field(50, ge=1, description="collect-and-learn iterations")
    prompts_per_step: int = Field(4, ge=1, description="distinct prompts sampled per step")
    num_samples: int = Field(4, ge=2, description="responses per prompt (group size G)")
    updates_per_step: int = Field(1, ge=1, description="optimizer steps over each batch")
    minibatch_size: int | None = Field(
        None, ge=1, description="sequences per optimizer step (default: the whole batch)"
    )
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: strictly on-policy; async: collect while training"
    )
    max_staleness: int = Field(
        1, ge=0, description="async: drop samples more than this many versions old"
    )
    reference: bool = Field(False, description="load a frozen reference model (for KL to ref)")
    generation: GenerationSettings = Field(
        default_factory=lambda: GenerationSettings(max_new_tokens=64),
        description="sampling settings",
    )
    loss: GRPOLossSettings = Field(default_factory=GRPOLossSettings, description="loss")
    advantage: AdvantageSettings = Field(default_factory=AdvantageSettings, description="adv.")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-6, schedule="constant"),
        description="optimizer and schedule",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="optional LoRA")
    checkpoint: CheckpointConfig = Field(
        default_factory=lambda: CheckpointConfig(every=25, best_metric="reward_mean"),
        description="checkpoints and resume",
    )

    @model_validator(mode="after")
    def _reference_needed(self) -> GRPOConfig:
        if self.loss.kl_to_ref_coeff > 0 and not self.reference:
            raise ValueError("loss.kl_to_ref_coeff > 0 needs `reference: true`")
        return self
