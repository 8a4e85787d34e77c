"""The ``eval`` stage's config: held-out accuracy and pass@k of a model or checkpoint."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llmrl.config.common import GenerationSettings, StageConfig
from llmrl.core.config_loading import MAX_BATCH, MAX_TOKENS


class EvalConfig(StageConfig):
    """Settings of ``llmrl eval``.

    Greedy accuracy on the prepared dataset's eval split, and pass@k for each k in ``pass_at``
    from ``num_samples`` sampled answers per problem (the unbiased estimator).
    """

    output_dir: str = Field("runs/eval", description="where results.jsonl and summary.json go")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="problems per generation batch")
    max_new_tokens: int = Field(
        128, ge=1, le=MAX_TOKENS, description="response length limit (greedy pass)"
    )
    num_samples: int = Field(
        0, ge=0, le=MAX_BATCH, description="sampled answers per problem for pass@k (0: off)"
    )
    pass_at: list[int] = Field(default_factory=lambda: [1], description="k values for pass@k")
    sampling: GenerationSettings = Field(
        default_factory=GenerationSettings,
        description="sampling settings for pass@k (max_new_tokens: `max_new_tokens` unless set)",
    )
    label: str = Field("model", description="name of what is evaluated, in tables and MLflow")
    engine_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        max_length=2048,
        description=(
            "URL of an OpenAI-compatible vLLM server (`vllm serve`) that serves the model: "
            "answers come from it and nothing is loaded here (model.name still gives the "
            "tokenizer); null: the model is loaded in this process"
        ),
    )
    engine_model: str | None = Field(
        None,
        max_length=1024,
        description="the served model's name at engine_url (null: the first one it lists)",
    )

    @field_validator("pass_at")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(k < 1 for k in values):
            raise ValueError("every k must be >= 1")
        return values

    @model_validator(mode="after")
    def _sampled_length(self) -> EvalConfig:
        if "max_new_tokens" not in self.sampling.model_fields_set:
            self.sampling.max_new_tokens = self.max_new_tokens
        return self

    @model_validator(mode="after")
    def _k_within_samples(self) -> EvalConfig:
        too_big = [k for k in self.pass_at if self.num_samples and k > self.num_samples]
        if too_big:
            raise ValueError(f"pass_at {too_big} exceeds num_samples={self.num_samples}")
        return self
