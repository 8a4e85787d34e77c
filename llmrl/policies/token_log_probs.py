"""Another model's log-probs of a batch's own tokens (one scoring pass, no generation).

What :class:`~llmrl.envs.transforms.RetrieveLogProb` writes as ``ref_log_probs`` (a frozen
reference) and :class:`~llmrl.scorers.teacher.TeacherScorer` as ``teacher_log_probs`` (a
distillation teacher): a ragged :class:`~llmrl.data.LogProbs` of the batch's
``("tokens", "full")``, split into ``prompt`` and ``response`` when the batch's tokens are.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from llmrl.data import LogProbs
from llmrl.policies.base import LLMWrapperBase


def scoring_twin(policy: LLMWrapperBase) -> LLMWrapperBase:
    """``policy`` as a scorer of given token ids (tokens mode, ragged output), sharing its
    weights or engines."""
    return policy.get_new_version(
        generate=False, input_mode="tokens", pad_output=False, return_log_probs=True
    )


def batch_log_probs(
    scorer: LLMWrapperBase, batch: TensorDictBase, assistant_only: bool = True
) -> LogProbs:
    """``scorer``'s log-probs of ``batch``'s ``("tokens", "full")`` (a :func:`scoring_twin`).

    With ``assistant_only``, positions of ``full`` outside the batch's assistant mask hold 0,
    so only tokens a loss trains on carry a value; ``prompt`` and ``response`` keep theirs.
    """
    keys = scorer.keys
    scored = scorer(batch.select(keys["tokens"], keys["masks"], strict=False))
    log_probs = scored.get(keys["log_probs"])
    if not assistant_only:
        return log_probs
    masks = scored.get(keys["masks"])
    full = [
        values * mask
        for values, mask in zip(log_probs.as_list("full"), masks.as_list("assistant"), strict=True)
    ]
    return type(log_probs).from_sequences(
        prompt=log_probs.as_list("prompt") if log_probs.has("prompt") else None,
        response=log_probs.as_list("response") if log_probs.has("response") else None,
        full=full,
    )
