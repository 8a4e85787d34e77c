"""The ``grpo`` stage's config: group-relative policy optimisation on a task's reward."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from llmrl.config.audit import AuditSettings
from llmrl.config.common import (
    CheckpointConfig,
    GenerationSettings,
    LoraSettings,
    OptimizerConfig,
    StageConfig,
    ToolSettings,
)
from llmrl.config.model_signals import DistillationSettings, RewardSettings
from llmrl.config.reward_shaping import RewardShapingSettings
from llmrl.config.runtime_settings import RuntimeSettings
from llmrl.core.config_loading import MAX_BATCH, MAX_STEPS, MAX_TOKENS, ConfigModel
from llmrl.topology.spec import Topology

TOPOLOGY_ENV = "LLMRL_TOPOLOGY"
"""A YAML file holding the cluster's topology (the chart's ConfigMap, mounted in stage pods),
read when the config names no ``topology``."""


class MismatchSettings(ConfigModel):
    """Train/inference mismatch correction (:mod:`llmrl.objectives.mismatch`): importance
    weights between the sampler's log-probs and the trainer's, per token or per sequence,
    truncated or masked."""

    level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one weight per token; sequence: the product of the sequence's "
        "token ratios, one weight for all its tokens",
    )
    mode: Literal["truncate", "mask"] = Field(
        "truncate",
        description="truncate: cap the weight at threshold; mask: drop (weight 0) the tokens or "
        "sequences whose ratio lies outside [1/threshold, threshold]",
    )
    threshold: float = Field(
        2.0,
        gt=0,
        le=1e6,
        description="the cap (truncate) or the band's edge (mask, must be > 1)",
    )

    @model_validator(mode="after")
    def _band(self) -> MismatchSettings:
        if self.mode == "mask" and self.threshold <= 1:
            raise ValueError(
                f"threshold: mode 'mask' keeps ratios in [1/threshold, threshold], so threshold "
                f"must be > 1 (got {self.threshold}); e.g. 2.0"
            )
        return self


class GRPOLossSettings(ConfigModel):
    """Options of :class:`llmrl.objectives.GRPOLoss` and its variants (``docs/algorithms.md``)."""

    variant: Literal["grpo", "gspo", "cispo"] = Field(
        "grpo",
        description="the policy-gradient term. grpo: PPO's clipped token ratio; gspo: one "
        "length-normalised ratio per sequence, clipped per sequence (GSPO; use a much "
        "narrower clip_epsilon, e.g. [3.0e-4, 4.0e-4]); cispo: REINFORCE weighted by the "
        "clipped, detached token ratio, no token's gradient cut (CISPO; e.g. clip_epsilon "
        "[1.0, 0.28])",
    )
    clip_epsilon: float | tuple[float, float] = Field(
        0.2,
        description="symmetric clip, or (eps_low, eps_high) for DAPO clip-higher; the clip of "
        "the token ratio (grpo), of the sequence ratio (gspo), or of the importance weight "
        "(cispo)",
    )
    kl_to_ref_coeff: float = Field(0.0, ge=0, description="k3 KL to the reference model")
    kl_to_inference_coeff: float = Field(0.0, ge=0, description="k3 KL to the sampling policy")
    entropy_coeff: float = Field(0.0, ge=0, description="entropy bonus")
    aggregation: Literal["token_mean", "prompt_mean", "sum_norm"] = Field(
        "token_mean",
        description="how per-token losses become one number: the mean over the batch's "
        "tokens, the mean of each sequence's mean, or each sequence's sum divided by "
        "generation.max_new_tokens (Dr. GRPO, with advantage.scale: none)",
    )
    masking_strategy: Literal["sft", "rlhf", "generic"] = Field(
        "sft", description="which tokens are trained: response, all assistant, all"
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="truncated importance sampling cap (None: off); the PPO ratio is anchored "
        "on each batch's log-probs before its first update. The same as mismatch: {level: "
        "token, mode: truncate, threshold: tis_cap}",
    )
    mismatch: MismatchSettings | None = Field(
        None,
        description="train/inference mismatch correction (null: off); its share of truncated "
        "or dropped tokens/sequences is logged as mismatch_fraction",
    )
    distillation: DistillationSettings | None = Field(
        None,
        description="on-policy distillation from topology.teacher (null: off): per-token "
        "advantages from the teacher's log-probs of the sampled tokens",
    )

    @model_validator(mode="after")
    def _one_correction(self) -> GRPOLossSettings:
        if self.tis_cap is not None and self.mismatch is not None:
            raise ValueError(
                "mismatch: tis_cap is already set; tis_cap is mismatch {level: token, mode: "
                "truncate}: set one of them"
            )
        return self


DEFAULT_MAX_RESAMPLE_ROUNDS = 3
"""``advantage.max_resample_rounds`` when ``drop_zero_std`` is on and the field is not set."""


class AdvantageSettings(ConfigModel):
    """The advantage estimator (:func:`llmrl.objectives.build_advantage`,
    ``docs/algorithms.md``), and dynamic sampling (:class:`llmrl.collectors.DynamicSampler`)."""

    estimator: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        "grpo",
        description="grpo: reward minus the group mean, scaled by `scale`; rloo: reward minus "
        "the mean of the group's other rewards (RLOO); reinforce_pp: reward (minus "
        "kl_in_reward_coeff x KL to the reference) normalised by the whole batch's mean and "
        "std, no group baseline (REINFORCE++)",
    )
    scale: Literal["group", "batch", "none"] = Field(
        "group",
        description="estimator grpo: divide by the group std, the batch std, or nothing (Dr. GRPO)",
    )
    kl_in_reward_coeff: float = Field(
        0.0,
        ge=0,
        description="estimator reinforce_pp: beta of REINFORCE++'s KL in the reward, "
        "R = reward - beta * sum over the response of (log pi_old - log pi_ref); needs "
        "`reference: true` on a dedicated reference (topology.reference.placement), which "
        "scores each batch before its advantages; 0: off",
    )
    drop_zero_std: bool = Field(
        False,
        description="dynamic sampling (DAPO): groups whose rewards are all equal carry no "
        "signal; they are dropped and more prompts are sampled until the step holds "
        "prompts_per_step groups with signal (bounded by max_resample_rounds)",
    )
    max_resample_rounds: int | None = Field(
        None,
        ge=0,
        le=MAX_BATCH,
        description="with drop_zero_std: extra sampling rounds a step may take (each draws "
        "prompts_per_step more prompts) before it trains on the groups with signal found so "
        f"far; 0: drop only, never resample; null: {DEFAULT_MAX_RESAMPLE_ROUNDS}",
    )

    @property
    def resample_rounds(self) -> int:
        """The extra sampling rounds a step may take (0 without ``drop_zero_std``)."""
        if not self.drop_zero_std:
            return 0
        rounds = self.max_resample_rounds
        return DEFAULT_MAX_RESAMPLE_ROUNDS if rounds is None else rounds

    @model_validator(mode="after")
    def _resampling_needs_dropping(self) -> AdvantageSettings:
        if self.max_resample_rounds is not None and not self.drop_zero_std:
            raise ValueError(
                "max_resample_rounds bounds the resampling of dynamic sampling, which only runs "
                "with drop_zero_std: true; set advantage.drop_zero_std: true (or remove "
                "advantage.max_resample_rounds)"
            )
        return self

    @model_validator(mode="after")
    def _options_of_the_estimator(self) -> AdvantageSettings:
        if self.scale != "group" and self.estimator != "grpo":
            raise ValueError(
                f"scale: {self.scale} is an option of estimator grpo; estimator "
                f"{self.estimator} has its own scaling (rloo: none, reinforce_pp: the batch "
                "std); remove advantage.scale (or set advantage.estimator: grpo)"
            )
        if self.kl_in_reward_coeff > 0 and self.estimator != "reinforce_pp":
            raise ValueError(
                "kl_in_reward_coeff is REINFORCE++'s KL in the reward; set "
                "advantage.estimator: reinforce_pp (or use loss.kl_to_ref_coeff, the KL as a "
                "loss term)"
            )
        return self


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
    steps: int = Field(50, ge=1, le=MAX_STEPS, description="collect-and-learn iterations")
    prompts_per_step: int = Field(
        4, ge=1, le=MAX_BATCH, description="distinct prompts sampled per step"
    )
    num_samples: int = Field(
        4, ge=2, le=MAX_BATCH, description="responses per prompt (group size G)"
    )
    updates_per_step: int = Field(
        1, ge=1, le=MAX_BATCH, description="optimizer steps over each batch"
    )
    minibatch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="sequences per optimizer step (default: the whole batch)",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="rows (sequences; one per turn of a multi-turn episode) per forward/backward "
        "on a trainer rank; their gradients add up into one optimizer step (gradient "
        "accumulation: less activation memory, the same update); default: a rank's whole "
        "minibatch at once",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="fill each forward/backward on a trainer rank with rows up to this many "
        "tokens (prompt + response; first-fit decreasing, a longer row alone) instead of a "
        "fixed row count, and give the ranks equal tokens rather than equal groups; the same "
        "update as the unsplit minibatch. Exclusive with micro_batch_size",
    )
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: strictly on-policy; async: collect while training"
    )
    max_staleness: int = Field(
        1,
        ge=0,
        le=MAX_STEPS,
        description="async: sampling runs at most this many policy versions ahead of training "
        "(the sampler waits)",
    )
    topology: Topology | None = Field(
        None,
        description="where the roles run (engines, env workers, trainer ranks, reference); "
        f"None: the file named by ${TOPOLOGY_ENV} when set, else Topology.local_default()",
    )
    runtime: RuntimeSettings = Field(
        default_factory=RuntimeSettings, description="Ray and torch.distributed settings"
    )
    reference: bool = Field(False, description="load a frozen reference model (for KL to ref)")
    generation: GenerationSettings = Field(
        default_factory=lambda: GenerationSettings(max_new_tokens=64),
        description="sampling settings",
    )
    loss: GRPOLossSettings = Field(default_factory=GRPOLossSettings, description="loss")
    advantage: AdvantageSettings = Field(default_factory=AdvantageSettings, description="adv.")
    reward_shaping: RewardShapingSettings = Field(
        default_factory=RewardShapingSettings, description="rewards shaped before advantages"
    )
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-6, schedule="constant"),
        description="optimizer and schedule",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="optional LoRA")
    audit: AuditSettings = Field(
        default_factory=AuditSettings, description="the consistency audit of every step"
    )
    tools: ToolSettings = Field(default_factory=ToolSettings, description="tools (multi-turn)")
    rewards: RewardSettings = Field(
        default_factory=RewardSettings,
        description="the task's reward, a reward model's and a judge's, weighted",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=lambda: CheckpointConfig(every=25, best_metric="reward_mean"),
        description="checkpoints and resume",
    )

    @property
    def turns_per_step(self) -> int:
        """Sampled turns in one step's batch: prompts x G (one row each on the trainer)."""
        return self.prompts_per_step * self.num_samples

    @property
    def minibatches(self) -> int:
        """Optimizer steps per pass over a step's batch (``minibatch_size`` rows each)."""
        turns = self.turns_per_step
        return math.ceil(turns / (self.minibatch_size or turns))

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps of the whole run: the learning-rate schedule's length."""
        return self.steps * self.updates_per_step * self.minibatches

    @model_validator(mode="after")
    def _reference_needed(self) -> GRPOConfig:
        if self.micro_batch_size is not None and self.max_tokens_per_micro_batch is not None:
            raise ValueError(
                "micro_batch_size and max_tokens_per_micro_batch both set: micro-batches are cut "
                "by rows or by tokens; keep max_tokens_per_micro_batch (even memory per pass "
                "whatever the response lengths) and set micro_batch_size: null"
            )
        if self.loss.kl_to_ref_coeff > 0 and not self.reference:
            raise ValueError("loss.kl_to_ref_coeff > 0 needs `reference: true`")
        if self.advantage.kl_in_reward_coeff > 0 and not self.reference:
            raise ValueError(
                "advantage.kl_in_reward_coeff > 0 needs the reference model's log-probs; set "
                "`reference: true` (with topology.reference.placement: dedicated)"
            )
        problems = _partial_rollout_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        if self.loss.distillation is not None and self.advantage.drop_zero_std:
            raise ValueError(
                "advantage.drop_zero_std drops groups whose task rewards are all equal, but "
                "loss.distillation's teacher signal is per token and exists in every group; set "
                "advantage.drop_zero_std: false"
            )
        problems = [
            *self.model.training_problems(),
            *self.reward_shaping.problems(self.generation.max_new_tokens),
        ]
        if problems:
            raise ValueError("\n".join(problems))
        if self.topology is not None:
            problems = topology_problems(self, self.topology)
            if problems:
                raise ValueError("\n".join(problems))
        return self


def _partial_rollout_problems(config: GRPOConfig) -> list[str]:
    """Why ``runtime.partial_rollouts`` cannot run with the rest of ``config``."""
    runtime = config.runtime
    if not runtime.partial_rollouts:
        return []
    problems = []
    if config.mode != "async" or config.max_staleness < 2:
        problems.append(
            "runtime.partial_rollouts: sampling runs one batch ahead, and a reply carried into "
            "a later batch is older still; needs mode: async with max_staleness >= 2 (got mode "
            f"{config.mode!r}, max_staleness {config.max_staleness})"
        )
    if config.tools.enabled:
        problems.append(
            "runtime.partial_rollouts: runs single-turn episodes; set tools off (or "
            "partial_rollouts: false)"
        )
    budget = config.generation.max_new_tokens
    if runtime.segment_tokens is not None and runtime.segment_tokens >= budget:
        problems.append(
            f"runtime.segment_tokens: {runtime.segment_tokens} >= generation.max_new_tokens "
            f"{budget}: every reply would end in its first segment; set it below the budget"
        )
    return problems


def topology_problems(config: GRPOConfig, topology: Topology) -> list[str]:
    """Why ``config`` cannot run on ``topology`` (empty when it can); each line starts with the
    field to change."""
    problems = []
    workers = topology.env_workers.count
    if workers < 1:
        problems.append(
            "topology.env_workers.count: the GRPO runtime runs the environments in env workers; "
            "must be >= 1"
        )
    elif config.prompts_per_step % workers:
        problems.append(
            f"prompts_per_step: each of the {workers} env workers (topology.env_workers.count) "
            f"draws an equal share of a step's prompts; must be a multiple of {workers}, got "
            f"{config.prompts_per_step}"
        )
    if config.reference and topology.reference.placement == "none":
        problems.append(
            "topology.reference.placement: `reference: true` needs a reference model; use "
            "'with_trainer' or 'dedicated' (or set reference: false)"
        )
    if (
        config.advantage.kl_in_reward_coeff > 0
        and config.reference
        and topology.reference.placement != "dedicated"
    ):
        problems.append(
            "advantage.kl_in_reward_coeff: REINFORCE++'s KL in the reward needs the reference "
            "log-probs before the advantages, which only a dedicated reference scores (a "
            f"'{topology.reference.placement}' reference scores in the trainer ranks, after "
            "them); set topology.reference.placement: dedicated (or use loss.kl_to_ref_coeff)"
        )
    problems.extend(_model_role_problems(config, topology))
    if topology.colocated and config.mode != "sync":
        problems.append(
            f"mode: {config.mode!r} with topology.colocated: the colocated engines sleep while the "
            "trainer ranks step, and an engine cannot sample while it sleeps, so sampling cannot "
            f"run ahead of training (max_staleness {config.max_staleness}); set mode: sync (or "
            "topology.colocated: false)"
        )
    if config.lora.enabled and topology.trainer.strategy == "fsdp":
        problems.append(
            "lora.enabled: LoRA adapters are not sharded by llmrl's FSDP path; use "
            "topology.trainer.strategy 'ddp' (or 'single') with LoRA"
        )
    if config.lora.pushes_adapter and topology.weight_transport in ("broadcast", "vllm"):
        problems.append(
            f"lora.sync: 'adapter' pushes the adapter through the Ray object store to the "
            f"engines, which load it over their base model; topology.weight_transport "
            f"'{topology.weight_transport}' carries whole models (set it to 'auto', or "
            "lora.sync: merged)"
        )
    if config.lora.pushes_adapter and config.runtime.compile_decode is True:
        problems.append(
            "runtime.compile_decode: the compiled decode runs the plain model, and with "
            "lora.sync 'adapter' the transformers engines serve a peft model (set it to false, "
            "or lora.sync: merged)"
        )
    if config.runtime.compile_decode is True and topology.inference.backend != "transformers":
        problems.append(
            "runtime.compile_decode: compiles the transformers engines' decode step; the "
            f"{topology.inference.backend} backend captures its own graphs (set it to false)"
        )
    return problems


def _model_role_problems(config: GRPOConfig, topology: Topology) -> list[str]:
    """The model roles the config uses and the topology lacks (and the other way round)."""
    used = {name: f"rewards.{name}" for name in config.rewards.models()}
    if config.loss.distillation is not None:
        used["teacher"] = "loss.distillation"
    problems = []
    for name in ("teacher", "judge", "reward_model"):
        if getattr(topology, name, None) is not None and name not in used:
            problems.append(
                f"topology.{name}: the config does not use a {name} (set "
                f"{'loss.distillation' if name == 'teacher' else 'rewards.' + name}), so its "
                "engines would idle; remove it from the topology"
            )
    for name, field in used.items():
        if getattr(topology, name, None) is None:
            problems.append(
                f"{field}: needs a {name} model: set topology.{name} (a model with its engines, "
                "or the url of a served one)"
            )
    return problems
