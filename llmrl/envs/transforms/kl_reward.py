"""`KLRewardTransform`: penalises the reward by the KL between the policy and a reference."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from llmrl.envs.transforms.base import EnvTransform
from llmrl.envs.transforms.retrieve_log_prob import RetrieveLogProb

if TYPE_CHECKING:
    from llmrl.policies import LLMWrapperBase


class KLRewardTransform(EnvTransform):
    """``reward -= coeff * sum_t (log_probs_t - ref_log_probs_t)`` over the response tokens.

    ``log_probs`` are the sampling log-probs the policy wrote; ``ref_log_probs`` come from
    ``ref_policy`` (via :class:`RetrieveLogProb`). The per-token difference is the standard
    single-sample KL(policy || ref) estimate; the per-sequence sum is written to ``kl_to_ref``
    so it can be logged.
    """

    def __init__(
        self,
        ref_policy: LLMWrapperBase,
        coeff: float,
        log_probs_key: str = "log_probs",
        ref_log_probs_key: str = "ref_log_probs",
    ) -> None:
        if coeff < 0:
            raise ValueError(f"coeff must be >= 0, got {coeff}")
        self.coeff = coeff
        self.log_probs_key = log_probs_key
        self.retrieve = RetrieveLogProb(ref_policy, out_key=ref_log_probs_key)

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        td = self.retrieve.on_step(td)
        current = td.get(self.log_probs_key).as_list("response")
        reference = td.get(self.retrieve.out_key).as_list("response")
        kl = torch.stack([(c - r).sum() for c, r in zip(current, reference, strict=True)]).detach()
        td.set("kl_to_ref", kl)
        td.set("reward", td.get("reward") - self.coeff * kl)
        return td

    def __repr__(self) -> str:
        return f"KLRewardTransform(coeff={self.coeff})"
