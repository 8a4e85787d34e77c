"""Load tokenizers and causal LMs from any model spec (known name, directory, GGUF, hub id).

A local folder (a directory, or a GGUF's conversion) is checked first
(:func:`~llmrl.models.folder_checks.check_model_folder`): custom code, pickled weights and an
unsafe chat template are refused before ``transformers`` reads anything. Custom code and pickled
weights stay off unless asked for (``trust_remote_code``, ``allow_pickled_weights``: the
:class:`~llmrl.config.common.ModelConfig` fields of the same names, see its ``load_options``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from llmrl.models.folder_checks import check_model_folder
from llmrl.models.gguf_cache import ensure_converted
from llmrl.models.spec import DEFAULT_MODEL, ModelSource, resolve_spec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTypeLike = torch.dtype | str


def load_tokenizer(
    spec: str | Path = DEFAULT_MODEL, *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Load the tokenizer (with its chat template) for a model spec.

    Raises :class:`~llmrl.models.errors.UnsafeModelError` for a folder with custom code (unless
    ``trust_remote_code``) or an unsafe chat template.

    Example:
        >>> tok = load_tokenizer("smollm2-135m-instruct")
        >>> text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        >>> text.endswith("<|im_start|>user\\nhi<|im_end|>\\n")
        True
    """
    from transformers import AutoTokenizer

    folder, options = _weights_location(resolve_spec(spec), trust_remote_code, True)
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, **options)


def load_model(
    spec: str | Path = DEFAULT_MODEL,
    dtype: DTypeLike = torch.float32,
    device: str | torch.device = "cpu",
    *,
    trust_remote_code: bool = False,
    allow_pickled_weights: bool = False,
) -> PreTrainedModel:
    """Load a causal LM for a model spec, in eval mode, on ``device`` with ``dtype``.

    A GGUF spec (including the default ``smollm2-135m-instruct``) is converted once into a
    safetensors cache directory; later loads read that directory. Only safetensors weights are
    read unless ``allow_pickled_weights``; a folder's custom code only with
    ``trust_remote_code`` (else :class:`~llmrl.models.errors.UnsafeModelError`).
    """
    from transformers import AutoModelForCausalLM

    source = resolve_spec(spec)
    folder, options = _weights_location(source, trust_remote_code, allow_pickled_weights)
    if not allow_pickled_weights:
        options["use_safetensors"] = True
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=as_dtype(dtype), trust_remote_code=trust_remote_code, **options
    )
    return model.to(device).eval()


def model_location(
    spec: str | Path, *, trust_remote_code: bool = False, allow_pickled_weights: bool = False
) -> tuple[str, dict]:
    """The folder (or hub id) ``from_pretrained`` reads for a model spec, and the options it
    needs: what :func:`load_model` reads, for loaders of other model classes (a reward
    model's classifier). A local folder is checked first, as in :func:`load_model`."""
    return _weights_location(resolve_spec(spec), trust_remote_code, allow_pickled_weights)


def as_dtype(dtype: DTypeLike) -> torch.dtype:
    """Accept ``torch.float32`` or a name such as ``"bfloat16"``; reject anything else clearly."""
    candidate = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype), None)
    if not isinstance(candidate, torch.dtype) or not candidate.is_floating_point:
        raise ValueError(
            f"dtype {dtype!r} is not a torch floating-point dtype "
            "(use e.g. 'float32', 'bfloat16', 'float16')"
        )
    return candidate


def _weights_location(
    source: ModelSource, trust_remote_code: bool, allow_pickled_weights: bool
) -> tuple[str, dict]:
    """The folder or hub id to hand to ``from_pretrained``, and the options it needs; a local
    folder is checked first (:func:`check_model_folder`)."""
    if source.kind == "hub":  # checked by transformers: trust_remote_code, use_safetensors
        return source.location, {}
    folder = ensure_converted(source.location) if source.kind == "gguf" else Path(source.location)
    check_model_folder(Path(folder), trust_remote_code, allow_pickled_weights)
    return str(folder), {"local_files_only": True}
