"""Policies: the LLM behind one TensorDict API, over transformers or vLLM.

Layer 2 (policies, envs, objectives): imports layers 0-1.

``vLLMWrapper`` is imported lazily so ``import llmrl.policies`` works without vLLM installed.
"""

from __future__ import annotations

from typing import Any

from llmrl.policies.base import LLMWrapperBase
from llmrl.policies.batching import BatchingClosedError, RequestBatcher
from llmrl.policies.generation_kwargs import GenerationKwargs, GenerationKwargsError
from llmrl.policies.io_spec import INPUT_MODES, GeneratedSample, PolicyIOSpec, ScoreResult
from llmrl.policies.transformers_wrapper import TransformersWrapper

__all__ = [
    "INPUT_MODES",
    "BatchingClosedError",
    "GeneratedSample",
    "GenerationKwargs",
    "GenerationKwargsError",
    "LLMWrapperBase",
    "PolicyIOSpec",
    "RequestBatcher",
    "ScoreResult",
    "TransformersWrapper",
    "vLLMWrapper",
]


def __getattr__(name: str) -> Any:
    if name == "vLLMWrapper":
        from llmrl.policies.vllm_wrapper import vLLMWrapper

        return vLLMWrapper
    raise AttributeError(f"module 'llmrl.policies' has no attribute {name!r}")
