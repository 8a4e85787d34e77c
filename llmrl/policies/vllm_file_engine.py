"""The two sides of the ``llmrl_file`` weight-transfer backend: a vLLM ``WeightTransferEngine``
that loads a safetensors file into the running model (in each worker), and the
``TrainerWeightTransferEngine`` that writes the file and drives the update (in the trainer).

vLLM imports this module inside each worker process when an engine is built with
``weight_transfer_config={"backend": "llmrl_file"}`` (registered by
:func:`llmrl.policies.vllm_file_transfer.register`). Each ``update_weights`` call loads one whole
file, and only once its SHA-256 matches the trainer's, so a bad file leaves the model as it was
(vLLM's ``start_weight_update`` / ``finish_weight_update`` are no-ops here):

1. the file's SHA-256 is checked against the one the trainer sent;
2. vLLM's layerwise reload takes the processed kernels apart (vLLM's CPU build repacks every
   linear weight into a oneDNN buffer after loading, so loading into the live parameters
   fails), the model's ``load_weights`` maps Hugging Face names onto vLLM's fused parameters
   (q/k/v, gate/up), re-processing each layer once it is whole, and the reload is finalised;
3. the vocabulary layers are re-processed, so that an output head tied to the embedding packs
   the new embedding (vLLM 0.32 processes a tied parameter through one parent only: without
   this the head stays stale, silently).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

from llmrl.data.sources import sha256_file
from llmrl.policies.vllm_file_transfer import BACKEND, write_weights


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """No rendezvous: the files are found by path."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    """One update: the safetensors file on this node, and its SHA-256 (empty: not checked)."""

    path: str
    sha256: str = ""


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Loads a safetensors file written by the trainer side into this worker's model."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        return None

    def start_weight_update(self) -> None:
        return None

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        path = Path(update_info.path)
        if not path.is_file():
            raise FileNotFoundError(f"weight file {path} is not on this engine's node")
        if update_info.sha256 and sha256_file(path) != update_info.sha256:
            raise ValueError(
                f"weight file {path}: its SHA-256 does not match the one the trainer sent (a "
                "partial or replaced file); the engine refuses to load it"
            )
        initialize_layerwise_reload(self.model)
        self.model.load_weights(_read_tensors(path, self.device))
        finalize_layerwise_reload(self.model, self.model_config)
        refresh_vocabulary_layers(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # vLLM's base class calls torch.accelerator.synchronize(), which fails on its CPU build.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def finish_weight_update(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


def refresh_vocabulary_layers(model: torch.nn.Module) -> int:
    """Re-process every vocabulary layer (embeddings, output heads) of a vLLM model from its
    current weight; how many there were."""
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, VocabParallelEmbedding) and method is not None:
            method.process_weights_after_loading(module)
            count += 1
    return count


def _read_tensors(path: Path, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as reader:
        for name in reader.keys():  # noqa: SIM118 (safe_open is not iterable)
            yield name, reader.get_tensor(name)


@dataclass
class FileTrainerInitInfo(TrainerInitInfo):
    """The trainer side of ``llmrl_file``: where to write the files (None: ``/dev/shm`` when
    there is one), which must be a folder the engines' workers can read."""

    backend: ClassVar[str] = BACKEND
    folder: str | None = None


class FileTrainerWeightTransferEngine(TrainerWeightTransferEngine[FileTrainerInitInfo]):
    """Writes the source's tensors to one safetensors file per push and has the engines load
    it: ``start_weight_update``, one ``update_weights`` with the file's path and SHA-256,
    ``finish_weight_update``; the file is deleted afterwards, whatever happened."""

    init_info_cls = FileTrainerInitInfo

    def __init__(
        self,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource,
        is_sender: bool = True,
        folder: str | None = None,
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.folder = folder

    @classmethod
    def trainer_init(
        cls,
        init_info: FileTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> FileTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("the llmrl_file trainer engine needs a WeightSource")
        engine = cls(
            client=client, source=source, is_sender=init_info.is_sender, folder=init_info.folder
        )
        if engine.is_sender:
            engine.client.init_weight_transfer_engine({})
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        if not self.is_sender:  # nothing to send, but a lazy source gathers across ranks:
            deque(self.source, maxlen=0)  # iterate it in step with the sender
            return
        path = write_weights(iter(self.source), self.folder)
        try:
            self.client.start_weight_update()
            self.client.update_weights({"path": str(path), "sha256": sha256_file(path)})
            self.client.finish_weight_update()
        finally:
            path.unlink(missing_ok=True)
