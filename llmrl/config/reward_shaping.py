"""The ``reward_shaping`` section of the GRPO config: changes to each collected reward (and a
per-row loss mask) applied before the advantages (:mod:`llmrl.objectives.reward_shaping`,
``docs/algorithms.md``). Every option is off by default."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmrl.core.config_loading import MAX_TOKENS, ConfigModel

MAX_SHAPING = 1e6
"""Upper bound of penalties, coefficients and replacement rewards."""


class OverlongBufferSettings(ConfigModel):
    """DAPO's soft overlong punishment: a linear penalty over the last ``length`` tokens of the
    budget ``generation.max_new_tokens``."""

    length: int = Field(
        ...,
        ge=1,
        le=MAX_TOKENS,
        description="L_buf: a response of L tokens past max_new_tokens - L_buf gets "
        "-penalty * (L - (max_new_tokens - L_buf)) / L_buf added to its reward (-penalty at "
        "the budget); must be < generation.max_new_tokens",
    )
    penalty: float = Field(
        1.0, gt=0, le=MAX_SHAPING, description="the penalty of a response at the budget"
    )


class LengthPenaltySettings(ConfigModel):
    """Kimi k1.5's length reward, weighted: within a group of lengths min..max, response i
    gets ``coeff * lambda_i`` when correct and ``coeff * min(0, lambda_i)`` when not, with
    ``lambda_i = 0.5 - (L_i - min) / (max - min)`` (0 when every length is equal)."""

    coeff: float = Field(
        ...,
        gt=0,
        le=MAX_SHAPING,
        description="the weight of the length reward (its range is [-0.5, 0.5])",
    )


class RepetitionSettings(ConfigModel):
    """A filter of degenerate responses: the n-gram repetition ratio of a response of L tokens
    is ``1 - distinct n-grams / (L - n + 1)`` (0 when L < n); over ``max_ratio`` the response
    gets ``reward`` (action reward) or is left out of the loss (action mask)."""

    ngram: int = Field(4, ge=1, le=MAX_TOKENS, description="n, the n-gram length in tokens")
    max_ratio: float = Field(
        ...,
        ge=0,
        lt=1,
        description="responses whose repetition ratio exceeds this are filtered (0: any "
        "repeated n-gram)",
    )
    action: Literal["reward", "mask"] = Field(
        "reward",
        description="reward: the response's reward becomes `reward` (in place of every "
        "other shaping); mask: its loss mask is cleared (its reward still counts in its group's "
        "baseline)",
    )
    reward: float | None = Field(
        None,
        ge=-MAX_SHAPING,
        le=MAX_SHAPING,
        description="action reward: the reward a filtered response gets (required there)",
    )

    @model_validator(mode="after")
    def _reward_of_the_action(self) -> RepetitionSettings:
        if self.action == "reward" and self.reward is None:
            raise ValueError(
                "reward: action 'reward' gives a filtered response this reward; set "
                "reward_shaping.repetition.reward (e.g. 0.0), or action: mask"
            )
        if self.action == "mask" and self.reward is not None:
            raise ValueError(
                "reward: action 'mask' leaves the reward as it is; remove "
                "reward_shaping.repetition.reward (or set action: reward)"
            )
        return self


class RewardShapingSettings(ConfigModel):
    """Reward shaping of every collected batch before its advantages (all off by default; a
    run without any is unchanged bit for bit). Each option acts on a trajectory's final reply
    (every reply of a single-turn task) and is counted per step (``shaping/*``)."""

    overlong_buffer: OverlongBufferSettings | None = Field(
        None, description="DAPO's overlong buffer penalty (null: off)"
    )
    truncated: Literal["keep", "penalize", "mask"] = Field(
        "keep",
        description="replies cut off by generation.max_new_tokens before their end token. "
        "keep: as they are; penalize: truncated_penalty subtracted from the reward; mask: "
        "left out of the loss (their reward still counts in the group's baseline)",
    )
    truncated_penalty: float | None = Field(
        None,
        gt=0,
        le=MAX_SHAPING,
        description="truncated: penalize: subtracted from a cut-off reply's reward (required)",
    )
    length_penalty: LengthPenaltySettings | None = Field(
        None, description="Kimi k1.5's group-relative length reward (null: off)"
    )
    repetition: RepetitionSettings | None = Field(
        None, description="the n-gram repetition filter (null: off)"
    )

    @model_validator(mode="after")
    def _penalty_of_truncation(self) -> RewardShapingSettings:
        if self.truncated == "penalize" and self.truncated_penalty is None:
            raise ValueError(
                "truncated_penalty: truncated: penalize subtracts it from each cut-off reply's "
                "reward; set reward_shaping.truncated_penalty (e.g. 1.0)"
            )
        if self.truncated != "penalize" and self.truncated_penalty is not None:
            raise ValueError(
                f"truncated_penalty is only used by truncated: penalize, not "
                f"{self.truncated!r}; remove reward_shaping.truncated_penalty"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether any option changes a reward or masks a row."""
        return (
            self.overlong_buffer is not None
            or self.truncated != "keep"
            or self.length_penalty is not None
            or self.repetition is not None
        )

    @property
    def masks(self) -> bool:
        """Whether an option may take rows out of the loss (the batch then carries
        ``loss_mask``)."""
        repetition = self.repetition
        return self.truncated == "mask" or (repetition is not None and repetition.action == "mask")

    def problems(self, max_new_tokens: int) -> list[str]:
        """What does not fit the generation budget ``max_new_tokens`` (each line starts with
        the field to change)."""
        buffer = self.overlong_buffer
        if buffer is not None and buffer.length >= max_new_tokens:
            return [
                f"reward_shaping.overlong_buffer.length: the buffer ({buffer.length} tokens) "
                f"must be shorter than generation.max_new_tokens ({max_new_tokens}), the budget "
                "it ends at; lower the buffer or raise generation.max_new_tokens"
            ]
        return []
