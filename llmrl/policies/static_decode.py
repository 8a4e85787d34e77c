"""A static KV cache and a compiled decode step (``TransformersWrapper``'s ``compile_decode``).

With its default cache, ``generate`` grows every layer's keys and values by one position per
token (new tensors each step) and runs the model eagerly: for a 30-layer model, a few hundred
small kernels and their Python dispatch per token. A ``StaticCache`` allocates
``[rows, kv_heads, length, head_dim]`` once and writes each step in place, so a decode step has
the same shapes every time and ``torch.compile`` turns it into one graph with the elementwise
work (norms, rotary embeddings, SiLU) fused.

Costs, measured in ``benchmarks/README.md``: the first call with a new number of rows or a new
cache length compiles the step (tens of seconds on a CPU); cache lengths are rounded up to
:data:`CACHE_BUCKET` positions so prompts of different widths reuse one graph, and each step
then attends over the whole bucket (masked), which is cheap next to the matmuls at these sizes.
It pays on CUDA, where the step runs as a CUDA graph and the eager decode loop is launch-bound,
and not on a CPU (figures: ``benchmarks/results/gpu.json`` and ``docs/measurements.md``):
:func:`resolve_compile_decode` turns it on for CUDA only.
"""

from __future__ import annotations

from typing import Any

import torch

CACHE_BUCKET = 64


def resolve_compile_decode(setting: bool | None, device: torch.device) -> bool:
    """Whether to sample with the compiled decode: ``setting`` when given, else (None) on for a
    model on CUDA and off elsewhere, where the eager decode loop is faster."""
    if setting is not None:
        return setting
    return torch.device(device).type == "cuda"


def static_cache_length(prompt_width: int, max_new_tokens: int, bucket: int = CACHE_BUCKET) -> int:
    """Positions the cache holds: prompt and response, rounded up to a multiple of ``bucket``."""
    needed = prompt_width + max_new_tokens
    return -(-needed // bucket) * bucket


def decode_compile_config(device: torch.device) -> Any:
    """The ``CompileConfig`` ``generate`` compiles its decode step with.

    transformers only compiles on accelerators unless told otherwise; on a CPU the step is
    compiled too (inductor's C++ kernels), without CUDA graphs (``mode="default"``).
    """
    from transformers import CompileConfig

    mode = "reduce-overhead" if device.type == "cuda" else "default"
    config = CompileConfig(fullgraph=False, dynamic=None, mode=mode)
    config._compile_all_devices = True  # transformers' own switch for compiling off-accelerator
    return config


@torch.no_grad()
def static_decode_cache(model: Any, length: int, prefix: Any | None = None) -> Any:
    """A ``StaticCache`` of ``length`` positions for ``model``: empty (``generate`` prefills it),
    or holding the rows and positions of ``prefix`` (a filled ``DynamicCache``, e.g. the shared
    prompt cache)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=length)
    if prefix is None or any(layer.is_sliding for layer in cache.layers):
        return cache  # generate prefills it (a sliding window keeps its own positions)
    first = prefix.layers[0].keys
    cache.early_initialization(
        batch_size=first.shape[0],
        num_heads=first.shape[1],
        head_dim=first.shape[-1],
        dtype=first.dtype,
        device=first.device,
    )
    filled = first.shape[2]
    for static, dynamic in zip(cache.layers, prefix.layers, strict=True):
        static.keys[:, :, :filled].copy_(dynamic.keys)
        static.values[:, :, :filled].copy_(dynamic.values)
        static.cumulative_length.fill_(filled)
    return cache
