"""The GRPO config's ``audit`` section: the consistency checks of every step
(:mod:`llmrl.train.audit`)."""

from __future__ import annotations

from pydantic import Field

from llmrl.core.config_loading import ConfigModel


class AuditSettings(ConfigModel):
    """The consistency audit of every step (:mod:`llmrl.train.audit`, ``docs/algorithms.md``):
    the sampler's log-probs against the trainer's, the engines' weight checksums against the
    trainer's after each push, and the token round trip of the sampled responses. Each number is
    logged (``audit/*``); a threshold exceeded stops the run with an error naming the step, the
    engine and the gap, before an optimizer step uses the data."""

    enabled: bool = Field(
        True,
        description="measure and check on every step (false: none of it, no audit/* metrics)",
    )
    max_logprob_gap_mean: float | None = Field(
        0.1,
        gt=0,
        le=1e6,
        description="stop when an engine's mean |sampler - trainer| log-prob over its sampled "
        "tokens (audit/logprob_gap_mean, nats per token) exceeds this; null: log only. "
        "0.1 is far above rounding (fp32: ~1e-6, bfloat16: ~1e-2) and the drift of one "
        "version of staleness at the shipped learning rates, and far below an engine on "
        "wrong weights (tenths of a nat and more)",
    )
    max_logprob_gap_max: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="stop when one token's |sampler - trainer| log-prob (audit/logprob_gap_max) "
        "exceeds this; null (default): log only, since a single rare token's gap under "
        "bfloat16 rounding can reach nats (tests/gpu/test_decode.py's bound)",
    )
    stop_on_checksum_mismatch: bool = Field(
        True,
        description="stop when an engine's checksum of the weights it holds after a push is "
        "not the trainer's (audit/weight_checksum_mismatches); false: log only",
    )
    max_roundtrip_mismatch_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="stop when more than this fraction of a step's responses do not re-encode "
        "to their sampled tokens (audit/token_roundtrip_mismatch_fraction); null (default): "
        "log only, since a policy may sample a non-canonical split of a word, which is not an "
        "error when the trainer trains on the sampled tokens (multi-turn prompts re-encode text: "
        "bound it there)",
    )
