"""`FrozenReference`: the starting model of a training stage, scoring batches without gradients
(the reference of MinorSFT and of a KL-to-reference term).

With LoRA the reference is the trained model itself with its adapters switched off
(``peft``'s ``disable_adapter()``): the base weights never train, so they are the starting
model, and no second copy is held. Otherwise a frozen copy is loaded from the model spec.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.train.lora import is_peft_model


class FrozenReference:
    """Writes the reference's log-probs of a batch's conversations (ragged :class:`LogProbs`,
    ``full``) under ``out_key``: what :class:`~llmrl.objectives.SFTLoss` reads.

    Args:
        model: the model being trained (its adapters are switched off to score, with LoRA).
        tokenizer: the tokenizer that templates the chats (the trained model's).
        spec, dtype, device: where to load the frozen copy from (without LoRA).
        out_key: where the log-probs go.

    Example:
        reference = FrozenReference(model, tokenizer, config.model.spec, "float32", "cpu")
        loss(reference(batch))  # batch gains ref_log_probs
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        spec: str,
        dtype: str,
        device: str,
        out_key: str = "ref_log_probs",
        load_options: dict[str, bool] | None = None,
        packing: bool = True,
    ) -> None:
        from llmrl.policies import TransformersWrapper

        self.shares_weights = is_peft_model(model)
        if self.shares_weights:
            reference = model
        else:
            from llmrl.models import load_model

            reference = load_model(spec, dtype=dtype, device=device, **(load_options or {}))
            reference.requires_grad_(False).eval()
        self.model = reference
        self.out_key = out_key
        self._scorer = TransformersWrapper(
            reference,
            tokenizer,
            generate=False,
            pad_output=False,
            return_log_probs=True,
            packing=packing,
        )

    def _reference_weights(self) -> AbstractContextManager:
        return self.model.disable_adapter() if self.shares_weights else nullcontext()

    @torch.no_grad()
    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` (``("history", "full")`` chats) with the reference's log-probs set."""
        key = self._scorer.input_key
        root = key if isinstance(key, str) else key[0]
        with self._reference_weights():
            scored = self._scorer(batch.select(root))
        batch.set(self.out_key, scored.get(self._scorer.keys["log_probs"]))
        return batch
