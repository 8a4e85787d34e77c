"""Load tokenizers and causal LMs from any model spec (known name, directory, GGUF, hub id)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from llmrl.models.gguf_cache import ensure_converted
from llmrl.models.spec import DEFAULT_MODEL, ModelSource, resolve_spec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTypeLike = torch.dtype | str


def load_tokenizer(spec: str | Path = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """Load the tokenizer (with its chat template) for a model spec.

    Example:
        >>> tok = load_tokenizer("smollm2-135m-instruct")
        >>> tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    """
    from transformers import AutoTokenizer

    folder, options = _weights_location(resolve_spec(spec))
    return AutoTokenizer.from_pretrained(folder, **options)


def load_model(
    spec: str | Path = DEFAULT_MODEL,
    dtype: DTypeLike = torch.float32,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """Load a causal LM for a model spec, in eval mode, on ``device`` with ``dtype``.

    A GGUF spec (including the default ``smollm2-135m-instruct``) is converted once into a
    safetensors cache directory; later loads read that directory.
    """
    from transformers import AutoModelForCausalLM

    folder, options = _weights_location(resolve_spec(spec))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=as_dtype(dtype), **options)
    return model.to(device).eval()


def as_dtype(dtype: DTypeLike) -> torch.dtype:
    """Accept ``torch.float32`` or a name such as ``"bfloat16"``; reject anything else clearly."""
    candidate = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype), None)
    if not isinstance(candidate, torch.dtype) or not candidate.is_floating_point:
        raise ValueError(
            f"dtype {dtype!r} is not a torch floating-point dtype "
            "(use e.g. 'float32', 'bfloat16', 'float16')"
        )
    return candidate


def _weights_location(source: ModelSource) -> tuple[str, dict]:
    """The folder or hub id to hand to ``from_pretrained``, and the options it needs."""
    if source.kind == "gguf":
        return str(ensure_converted(source.location)), {"local_files_only": True}
    if source.kind == "directory":
        return source.location, {"local_files_only": True}
    return source.location, {}
