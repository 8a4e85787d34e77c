"""The repeated decoder blocks of a Hugging Face causal LM, the unit that FSDP shards and
activation checkpointing recomputes."""

from __future__ import annotations

import torch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model.model.layers`` of an HF decoder (through a DDP or peft wrapper).

    Raises:
        ValueError: the model has no such list (named, with what was expected).
    """
    base = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(base, "get_base_model"):  # peft
        base = base.get_base_model()
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"cannot find the decoder layers of {type(base).__name__} (expected "
            "`model.model.layers`, as Hugging Face decoders have them)"
        )
    return list(layers)
