"""Model and tokenizer loading: known names, local directories, GGUF files, hub ids.

Layer 1 (data, models, topology, tracking): imports only llmrl.core.
"""

from llmrl.models.errors import ModelSpecError, UnsafeModelError
from llmrl.models.gguf_cache import cache_root, ensure_converted
from llmrl.models.loading import as_dtype, load_model, load_tokenizer, model_location
from llmrl.models.spec import DEFAULT_MODEL, KNOWN_MODELS, ModelSource, resolve_spec
from llmrl.models.tiny import tiny_model

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "ModelSource",
    "ModelSpecError",
    "UnsafeModelError",
    "as_dtype",
    "cache_root",
    "ensure_converted",
    "load_model",
    "load_tokenizer",
    "model_location",
    "resolve_spec",
    "tiny_model",
]
