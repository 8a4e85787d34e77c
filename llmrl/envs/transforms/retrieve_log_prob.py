"""`RetrieveLogProb`: stores another model's log-probs of the tokens the policy produced."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensordict import TensorDictBase

from llmrl.envs.transforms.base import EnvTransform
from llmrl.policies.token_log_probs import batch_log_probs, scoring_twin

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
        self.scorer = scoring_twin(policy)
        self.assistant_only = assistant_only
        self.out_key = out_key

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        td.set(self.out_key, batch_log_probs(self.scorer, td, self.assistant_only))
        return td
