"""Activation checkpointing: each decoder layer keeps only its input for backward and runs its
forward again there, instead of keeping every intermediate activation.

Cost: one more forward of every layer per backward (about a third more compute per training
step). Saving: the activations kept for backward drop from every intermediate tensor of every
layer (attention scores, MLP hidden states: tens of tensors a layer) to one hidden-state tensor
a layer. TRL turns it on by default; llmrl turns it on for CUDA trainers
(``model.activation_checkpointing``).

It is applied by replacing each layer's ``forward`` on the instance, so the module tree, the
parameter names, DDP and FSDP2's per-layer hooks are untouched (FSDP2 gathers the layer's
weights around the call, and again for the recomputation in backward). Unlike transformers'
own switch it works in eval mode, which llmrl's trainers use (no dropout: the sampler's and
the trainer's log-probs see the same network).

A forward that writes a KV cache (``past_key_values``, e.g. the shared-prompt scoring pass) is
not checkpointed: recomputing it would append its keys and values to the cache a second time.
Scoring code that wants the saving calls the model with ``use_cache=False``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from llmrl.models.layers import decoder_layers

_MARK = "_llmrl_activation_checkpointing"


def enable_activation_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Checkpoint every decoder layer of ``model`` (idempotent); returns ``model``."""
    for layer in decoder_layers(model):
        if getattr(layer, _MARK, False):
            continue
        layer.forward = functools.partial(_checkpointed, layer.forward)
        setattr(layer, _MARK, True)
    return model


def uses_activation_checkpointing(model: torch.nn.Module) -> bool:
    """Whether :func:`enable_activation_checkpointing` was applied to ``model``."""
    try:
        layers = decoder_layers(model)
    except ValueError:
        return False
    return bool(layers) and getattr(layers[0], _MARK, False)


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """``forward(*args, **kwargs)``, recomputed in backward when gradients are being recorded
    and the call writes no KV cache (see the module docstring)."""
    if not torch.is_grad_enabled() or kwargs.get("past_key_values") is not None:
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
