"""The parts of a Hugging Face causal LM that training code reaches into: the model inside its
wrappers, and the repeated decoder blocks that FSDP shards and activation checkpointing
recomputes."""

from __future__ import annotations

import torch


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP / DataParallel (``.module``) and ``torch.compile``
    (``._orig_mod``) wrappers; an FSDP2 or peft model is its own module."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model.model.layers`` of an HF decoder (through a DDP, compile or peft wrapper).

    Raises:
        ValueError: the model has no such list (named, with what was expected).
    """
    base = unwrapped(model)
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
