"""Optional LoRA adapters through peft, and the merged weights of a LoRA model.

:func:`merged_state_dict` gives the plain model's state dict with the adapters merged in,
``W + scale * B @ A`` computed layer by layer into new tensors: the live model is never touched
(no ``merge_adapter()`` / ``unmerge_adapter()``, whose round trip moves the base weights by
float rounding) and never copied (only the adapted weights are new; every other tensor is the
model's own, shared). Checkpoints (:mod:`llmrl.train.checkpoint`) and weight pushes to the
inference engines (:func:`inference_state_dict`) both use it.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from llmrl.config.common import LoraSettings
from llmrl.core.errors import MissingExtraError


def apply_lora(
    model: torch.nn.Module, settings: LoraSettings, float32_adapters: bool = True
) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters when ``settings.enabled`` (else return it as is).

    ``float32_adapters``: adapters of a bfloat16/float16 base are float32 (mixed precision: they
    are the trained master weights); False keeps them in the base's dtype."""
    if not settings.enabled:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingExtraError("peft", "local", "LoRA training") from None
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, autocast_adapter_dtype=float32_adapters)


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (without importing peft)."""
    peft = sys.modules.get("peft")  # a PeftModel cannot exist unless peft was imported
    return peft is not None and isinstance(model, peft.PeftModel)


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` (a ``peft.PeftModel`` with LoRA adapters) merged into a
    plain model: the base model's names, each adapted weight ``W + sum_a scale_a * B_a @ A_a``
    over the active adapters, summed in float32 and cast to ``W``'s dtype once (peft's
    ``merge_and_unload()`` rounds the delta to ``W``'s dtype before adding it: twice).

    The tensors of layers without adapters are the model's own (detached, not copied); the
    model is left exactly as it was.

    Raises:
        ValueError: an adapter this function cannot merge by the formula above (DoRA and other
            LoRA variants, ``lora_bias``, ``modules_to_save``), named.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    state = base.state_dict()
    for module_name, module in base.named_modules():
        if not isinstance(module, LoraLayer) or module.merged:
            continue  # a merged layer's base weight already holds its adapters
        key = f"{module_name}.base_layer.weight"
        weight = state[key]
        merged = weight.float()
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            variant = getattr(module, "lora_variant", {}).get(adapter)
            if variant is not None or module.use_dora.get(adapter, False):
                raise ValueError(
                    f"{module_name}: adapter {adapter!r} is a LoRA variant "
                    f"({type(variant).__name__ if variant else 'DoRA'}); only plain LoRA "
                    "adapters are merged weight by weight"
                )
            if getattr(module, "lora_bias", {}).get(adapter, False):
                raise ValueError(
                    f"{module_name}: adapter {adapter!r} has lora_bias; only plain LoRA "
                    "adapters are merged weight by weight"
                )
            merged = merged + module.get_delta_weight(adapter).float()
        state[key] = merged.to(weight.dtype)
    extra = [name for name in state if "modules_to_save" in name or "original_module" in name]
    if extra:
        raise ValueError(
            f"modules_to_save ({extra[0]}...) are not merged weight by weight; use plain LoRA "
            "adapters"
        )
    return {
        name.replace(".base_layer.", "."): tensor.detach()
        for name, tensor in state.items()
        if ".lora_" not in name
    }


def inference_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an inference engine loads, on the CPU: the model's own state dict, or for a
    LoRA model the merged one (:func:`merged_state_dict`; the model is left untouched)."""
    state = merged_state_dict(model) if is_peft_model(model) else model.state_dict()
    return {name: tensor.detach().cpu() for name, tensor in state.items()}
