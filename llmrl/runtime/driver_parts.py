"""The parts of a GRPO step that the driver holds, built once from the config for both
compositions: the in-process loop (:class:`~llmrl.runtime.grpo_loop.InProcessGRPO`) and the
distributed runtime (:class:`~llmrl.runtime.grpo_runtime.GRPORuntime`).

- the advantage estimator ``config.advantage`` selects (with the dedicated reference's scorer
  when REINFORCE++'s KL in the reward needs it);
- dynamic sampling over it (``advantage.resample_rounds`` extra rounds);
- ``reward_shaping`` of each round's batch, before its advantages (None: off);
- the driver's half of the consistency audit (None: off).

Example::

    parts = build_driver_parts(config, tokenizer=tokenizer)
    sampled = parts.sampler.sample(rounds)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmrl.collectors import DynamicSampler
from llmrl.objectives import build_advantage
from llmrl.objectives.reward_shaping import RewardShaper
from llmrl.train.audit import StepAudit

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from llmrl.config.grpo import GRPOConfig
    from llmrl.objectives.advantages import GroupAdvantage


@dataclass(frozen=True)
class DriverParts:
    """What :func:`build_driver_parts` builds (see the module docstring)."""

    advantage: GroupAdvantage
    sampler: DynamicSampler
    shaping: RewardShaper | None
    audit: StepAudit | None


def build_driver_parts(
    config: GRPOConfig,
    *,
    tokenizer: Any = None,
    reference: Callable[[TensorDictBase], TensorDictBase] | None = None,
) -> DriverParts:
    """The driver's parts of ``config``'s GRPO step. ``tokenizer`` serves the audit (loaded
    from ``config.model`` when the audit is on and none is given); ``reference`` scores a batch
    with the dedicated reference before its advantages (``advantage.kl_in_reward_coeff``)."""
    advantage = build_advantage(config, reference=reference)
    # dynamic sampling: each extra round samples another prompts x G answers
    sampler = DynamicSampler(advantage, config.prompts_per_step, config.advantage.resample_rounds)
    audit = None
    if config.audit.enabled:
        if tokenizer is None:
            from llmrl.models import load_tokenizer

            model = config.model
            tokenizer = load_tokenizer(model.spec, trust_remote_code=model.trust_remote_code)
        audit = StepAudit(config.audit, tokenizer)
    return DriverParts(
        advantage=advantage,
        sampler=sampler,
        shaping=RewardShaper.from_config(config),
        audit=audit,
    )
