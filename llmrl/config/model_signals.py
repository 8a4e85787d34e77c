"""How a GRPO run uses models as its training signal: reward models, LLM judges, a teacher.

Where each model runs is the topology's (``topology.reward_model``, ``topology.judge``,
``topology.teacher``: :mod:`llmrl.topology.model_roles`); how its output becomes a reward or an
advantage is written here:

- ``rewards``: a row's reward is ``task_weight * task reward + reward_model.weight * score +
  judge.weight * verdict``, each model's part scored in the env workers
  (:class:`~llmrl.envs.transforms.model_reward.ModelReward`);
- ``loss.distillation``: on-policy distillation, each response token's advantage is
  ``task_weight * A_i + coeff * (log p_teacher(t) - log p_sampler(t))``.

Example (YAML)::

    rewards:
      task_weight: 0.0                 # no checker: the judge alone
      judge: {weight: 1.0, timeout_s: 30, fallback_reward: 0.0}
    topology:
      judge: {model: smollm2-135m-instruct, backend: transformers, dtype: float32}
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from llmrl.core.config_loading import MAX_BATCH, MAX_TIMEOUT_S, MAX_TOKENS, ConfigModel

MAX_WEIGHT = 1e6
"""Bound of every reward weight and coefficient (a typo, not a setting, beyond it)."""

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading a student's answer to a problem.\n\n"
    "Problem:\n{problem}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Student's answer:\n{response}\n\n"
    "Is the student's final answer correct? Answer with one word: Yes or No."
)
"""The judge's user message; ``{problem}``, ``{reference}`` and ``{response}`` are filled in."""

TEMPLATE_FIELDS = ("problem", "reference", "response")


class ModelCallSettings(ConfigModel):
    """Faults of the calls to a model role: each request's deadline, retries, and the score a
    row gets when the model gives none (counted as a failure, never a crash)."""

    timeout_s: float = Field(
        120.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds one request (a batch of rows) may take before it is retried",
    )
    max_retries: int = Field(
        1, ge=0, le=100, description="retries of a request that timed out or failed"
    )
    fallback_reward: float = Field(
        0.0,
        ge=-MAX_WEIGHT,
        le=MAX_WEIGHT,
        description="the score of a row whose request failed after its retries, or whose "
        "answer held no verdict (weighted like a score, left out of the normalisation); "
        "counted in <role>/failures",
    )
    max_rows_per_request: int = Field(
        64,
        ge=1,
        le=MAX_BATCH,
        description="rows an env worker sends in one request (a larger batch is split)",
    )


class RewardModelSettings(ModelCallSettings):
    """A sequence-classification reward model (``topology.reward_model``) scores each
    (prompt, response) in the env workers."""

    weight: float = Field(
        1.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT, description="the score's weight in the reward"
    )
    normalize: bool = Field(
        False,
        description="z-score the scores over each env worker's batch (its prompts x "
        "num_samples rows) before weighting them: a reward model's scale is arbitrary",
    )
    max_length: int = Field(
        2048,
        ge=8,
        le=MAX_TOKENS,
        description="tokens of prompt + response the classifier reads; longer texts keep "
        "their end (the response)",
    )


class JudgeSettings(ModelCallSettings):
    """A generative judge (``topology.judge``) gives each response a verdict in the env workers.

    ``mode: verdict_logprobs`` scores each verdict word as the first tokens of the judge's
    answer and takes ``sum_v value_v * p_v / sum_v p_v`` (one scoring pass, no sampling; a
    verdict mass below ``min_verdict_prob`` counts as no verdict). ``mode: parse`` lets the judge
    answer (greedy, ``max_new_tokens``) and takes the value of the first verdict word found.
    """

    weight: float = Field(
        1.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT, description="the verdict's weight in the reward"
    )
    mode: Literal["verdict_logprobs", "parse"] = Field(
        "verdict_logprobs",
        description="verdict_logprobs: the probabilities of the verdict words as the answer's "
        "first tokens (robust, one scoring pass); parse: generate an answer and find a verdict "
        "word in it",
    )
    template: str = Field(
        DEFAULT_JUDGE_TEMPLATE,
        min_length=1,
        max_length=20_000,
        description="the judge's user message, with {problem}, {reference} and {response}",
    )
    verdicts: dict[str, float] = Field(
        default_factory=lambda: {"Yes": 1.0, "No": 0.0},
        min_length=2,
        description="verdict word -> its score",
    )
    min_verdict_prob: float = Field(
        0.05,
        ge=0,
        le=1,
        description="verdict_logprobs: a total probability of the verdict words below this "
        "means the judge is not answering the question (a failure)",
    )
    max_new_tokens: int = Field(
        32, ge=1, le=MAX_TOKENS, description="parse: tokens of the judge's answer"
    )

    @field_validator("template")
    @classmethod
    def _known_fields(cls, template: str) -> str:
        names = {match.group(1) for match in re.finditer(r"(?<!\{)\{(\w*)\}(?!\})", template)}
        unknown = sorted(names - set(TEMPLATE_FIELDS))
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; the "
                f"template may use {', '.join('{' + n + '}' for n in TEMPLATE_FIELDS)} (write "
                "{{ and }} for literal braces)"
            )
        if "response" not in names:
            raise ValueError("the template must contain {response}: the judge grades it")
        return template

    @field_validator("verdicts")
    @classmethod
    def _words(cls, verdicts: dict[str, float]) -> dict[str, float]:
        for word in verdicts:
            if not word.strip():
                raise ValueError("a verdict word is empty; use words such as Yes and No")
        return verdicts


class RewardSettings(ConfigModel):
    """The reward of each response: the task's, a reward model's and a judge's, weighted."""

    task_weight: float = Field(
        1.0,
        ge=-MAX_WEIGHT,
        le=MAX_WEIGHT,
        description="weight of the task's own reward (its checker); 0: the models alone",
    )
    task_timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="a task class from your own code: seconds one score call may take; a call "
        "past it gives the row task_fallback_reward (reward functions set their own)",
    )
    task_fallback_reward: float = Field(
        0.0,
        ge=-MAX_WEIGHT,
        le=MAX_WEIGHT,
        description="a task class from your own code: the reward of a row whose score call "
        "raised, timed out or returned NaN or a wrong type (flagged, counted in task/failures)",
    )
    reward_model: RewardModelSettings | None = Field(
        None, description="score with topology.reward_model (null: not used)"
    )
    judge: JudgeSettings | None = Field(
        None, description="grade with topology.judge (null: not used)"
    )

    def models(self) -> dict[str, RewardModelSettings | JudgeSettings]:
        """The model roles these rewards use, by topology role name."""
        found: dict[str, RewardModelSettings | JudgeSettings] = {}
        if self.reward_model is not None:
            found["reward_model"] = self.reward_model
        if self.judge is not None:
            found["judge"] = self.judge
        return found


class DistillationSettings(ConfigModel):
    """On-policy distillation from ``topology.teacher``: the teacher scores the student's
    sampled tokens (one scoring pass), and each token's advantage becomes
    ``task_weight * A_i + coeff * (log p_teacher - log p_sampler)``, the negative reverse KL of
    the student's own sample (``docs/algorithms.md``)."""

    coeff: float = Field(
        1.0, gt=0, le=MAX_WEIGHT, description="weight of the per-token teacher signal"
    )
    task_weight: float = Field(
        0.0,
        ge=0,
        le=MAX_WEIGHT,
        description="weight of the task's group advantage A_i (0: pure distillation)",
    )
