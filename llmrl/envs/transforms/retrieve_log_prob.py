"""`RetrieveLogProb`: stores another model's log-probs of the tokens the policy produced."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensordict import TensorDictBase

from llmrl.envs.transforms.base import EnvTransform

if TYPE_CHECKING:
    from llmrl.policies import LLMWrapperBase


class RetrieveLogProb(EnvTransform):
    """Scores each step's ``("tokens", "full")`` with ``policy`` (typically a frozen reference
    model) and writes a ragged :class:`LogProbs` under ``out_key`` (``ref_log_probs``).

    With ``assistant_only`` (default) positions outside the assistant mask hold 0 in ``full``,
    so only tokens a loss trains on carry a value. Any policy works: it is turned into a scoring
    twin in tokens mode, sharing the weights.
    """

    def __init__(
        self,
        policy: LLMWrapperBase,
        assistant_only: bool = True,
        out_key: str = "ref_log_probs",
    ) -> None:
        self.scorer = policy.get_new_version(
            generate=False, input_mode="tokens", pad_output=False, return_log_probs=True
        )
        self.assistant_only = assistant_only
        self.out_key = out_key

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        keys = self.scorer.keys
        scored = self.scorer(td.select(keys["tokens"], keys["masks"], strict=False))
        log_probs = scored.get(keys["log_probs"])
        if self.assistant_only:
            masks = scored.get(keys["masks"])
            full = [
                lp * m
                for lp, m in zip(log_probs.as_list("full"), masks.as_list("assistant"), strict=True)
            ]
            log_probs = type(log_probs).from_sequences(
                prompt=log_probs.as_list("prompt") if log_probs.has("prompt") else None,
                response=log_probs.as_list("response") if log_probs.has("response") else None,
                full=full,
            )
        td.set(self.out_key, log_probs)
        return td
