"""A vLLM weight-transfer backend that loads new weights from a safetensors file.

vLLM 0.32 updates a running engine's weights through its weight-transfer API: the engine is built
with ``weight_transfer_config={"backend": NAME}``, and each update is
``llm.start_weight_update()``, one or more ``llm.update_weights({"update_info": ...})`` and
``llm.finish_weight_update(weight_version=...)``. Inside each worker a
:class:`~vllm.distributed.weight_transfer.base.WeightTransferEngine` of that backend receives the
tensors; on the trainer's side a ``TrainerWeightTransferEngine`` of the same backend drives that
sequence through a client. vLLM's own backends need CUDA (``ipc``) or NCCL (``nccl``); this one,
``llmrl_file``, is both sides of a backend that passes a safetensors file the trainer side wrote
on the engines' node (``/dev/shm``), so it works on vLLM's CPU build and on GPUs alike (the file
is read straight onto the worker's device). llmrl drives every backend through the same trainer
engine calls (:mod:`llmrl.transports.vllm`), so the CPU tests run the code that drives GPUs.

The worker checks the file's SHA-256 against the one sent with the update before it touches the
model, then reloads the model from it with vLLM's layerwise reload; the output head tied to the
embedding is re-processed too (vLLM 0.32 leaves it stale, silently).

The worker side lives in :mod:`llmrl.policies.vllm_file_engine` (it imports vLLM); this module
is what the caller needs.

The backend must be registered in every process that builds or serves an engine: vLLM loads
``llmrl``'s ``vllm.general_plugins`` entry point (pyproject) in each of them, which calls
:func:`register`; :class:`~llmrl.policies.vllm_engine.VLLMEngine` also calls it.

Example:
    register()
    llm = vllm.LLM(model, weight_transfer_config={"backend": BACKEND})
    path = write_weights(model.state_dict().items(), folder="/dev/shm")
    llm.start_weight_update()
    llm.update_weights({"update_info": {"path": str(path), "sha256": sha256_file(path)}})
    llm.finish_weight_update(weight_version="3")
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

BACKEND = "llmrl_file"
"""The backend name to pass as ``weight_transfer_config={"backend": BACKEND}``."""


def register() -> None:
    """Register the ``llmrl_file`` backend with vLLM's weight-transfer factory (idempotent).

    vLLM calls this in every process through the ``vllm.general_plugins`` entry point.
    """
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    module = "llmrl.policies.vllm_file_engine"
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, module, "FileWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, module, "FileTrainerWeightTransferEngine"
        )


def write_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], folder: str | Path | None = None
) -> Path:
    """Write ``(name, tensor)`` pairs to a new safetensors file in ``folder`` and return it.

    ``folder`` defaults to ``/dev/shm`` when it exists (memory, no disk write), else the temp
    folder. Tied tensors (one storage under two names) are written once, under the first name;
    vLLM's models tie them again themselves. The caller deletes the file.
    """
    from safetensors.torch import save_file

    seen: set[tuple[int, int]] = set()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in named_tensors:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        state[name] = tensor.detach().to("cpu").contiguous()
    if folder is None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    handle, name = tempfile.mkstemp(prefix="llmrl-weights-", suffix=".safetensors", dir=folder)
    os.close(handle)
    try:
        save_file(state, name)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)
