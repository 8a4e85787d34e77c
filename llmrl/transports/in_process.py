"""`InProcessWeightUpdater`: weights into a policy (or model) living in this process."""

from __future__ import annotations

from typing import Any

import torch

from llmrl.core.weights_checksum import weights_checksum
from llmrl.transports.weights import (
    Delivery,
    Weights,
    WeightUpdater,
    as_state_dict,
    held_weights,
    state_dict_bytes,
)


class InProcessWeightUpdater(WeightUpdater):
    """Weights into a policy (or model) in this process.

    Args:
        target: a :class:`~llmrl.policies.TransformersWrapper` (its ``model``), a ``vLLMWrapper``
            (``load_weights``: the engines get the tensors and check the checksum) or a
            ``torch.nn.Module``.
        source: the trainer model pushed by default.

    Pushing the target's own model object costs no copy (bytes 0): the policy already sees the
    trainer's weights, only the version moves (the checksum is still computed, once). A copy is
    checksummed before loading and the target's state dict after, over the same names.
    """

    def __init__(self, target: Any, source: Weights | None = None) -> None:
        super().__init__(source)
        self.target = target

    def _push(self, weights: Weights, version: int) -> Delivery:
        model = self.target
        if not isinstance(model, torch.nn.Module):
            model = getattr(self.target, "model", None)  # a policy's model (vLLM: a name)
        if isinstance(weights, torch.nn.Module) and weights is model:
            checksum = weights_checksum(model.state_dict())
            return Delivery(0, checksum, (checksum,))
        state = as_state_dict(weights)
        checksum = weights_checksum(state)
        if isinstance(model, torch.nn.Module):
            with torch.no_grad():
                model.load_state_dict(state)
            held = weights_checksum(held_weights(model, state))
        elif callable(getattr(self.target, "load_weights", None)):
            self.target.load_weights(state.items(), version=version, checksum=checksum)
            held = checksum  # vLLM verified the tensors against it (see VLLMEngine.load_weights)
        else:
            raise TypeError(
                f"cannot load weights into {type(self.target).__name__}: expected a module, a "
                "policy with a `model`, or one with `load_weights`"
            )
        return Delivery(state_dict_bytes(state), checksum, (held,))
