"""LoRA adapters an inference engine swaps over its base model (peft).

With ``lora.sync: adapter`` a transformers engine holds its base model wrapped in peft's LoRA
layers of the trainer's shape (:func:`with_lora_adapter`), and each weight push replaces only
the adapter's tensors (:func:`load_adapter_state`), under the names
``peft.get_peft_model_state_dict`` gives the trainer's model (:func:`adapter_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmrl.core.errors import MissingExtraError


def with_lora_adapter(model: torch.nn.Module, lora_config: Mapping[str, Any]) -> Any:
    """``model`` wrapped in LoRA layers of ``lora_config`` (``r``, ``lora_alpha``,
    ``target_modules``, ``lora_dropout``); the adapters start as peft initialises them (B = 0:
    the base model's outputs) until :func:`load_adapter_state`."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingExtraError("peft", "local", "LoRA adapters on an engine") from None
    config = LoraConfig(task_type="CAUSAL_LM", **dict(lora_config))
    return get_peft_model(model, config, autocast_adapter_dtype=False)


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a ``peft.PeftModel`` under peft's saved names (no adapter name:
    ``...q_proj.lora_A.weight``), detached, where they live."""
    from peft import get_peft_model_state_dict

    return {name: t.detach() for name, t in get_peft_model_state_dict(model).items()}


@torch.no_grad()
def load_adapter_state(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Copy an adapter's tensors (:func:`adapter_state`'s names) into ``model``'s LoRA layers.

    Raises:
        ValueError: the names are not exactly the model's adapter (another shape of LoRA);
            nothing is loaded.
    """
    from peft import set_peft_model_state_dict

    expected = adapter_state(model)
    if set(state) != set(expected):
        extra, missing = sorted(set(state) - set(expected)), sorted(set(expected) - set(state))
        raise ValueError(
            f"adapter tensors do not match the engine's LoRA layers: {len(extra)} unknown "
            f"({extra[:2]}), {len(missing)} missing ({missing[:2]}); is lora the same on both?"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"adapter tensor {name}: shape {tuple(tensor.shape)}, the engine's is "
                f"{tuple(expected[name].shape)} (another lora.r?)"
            )
    set_peft_model_state_dict(model, dict(state))
