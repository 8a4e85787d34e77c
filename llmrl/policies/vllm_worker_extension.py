"""`WeightAuditWorkerExtension`: what a vLLM worker checks of the weights a push loaded.

vLLM builds its worker class at run time from ``worker_extension_cls`` (a dotted name, so the
class is importable in every worker process); its methods run inside each worker, called from
the engine through ``LLM.collective_rpc(method_name)``, where ``self`` is the vLLM worker.

Weights reach a worker through vLLM's weight-transfer engine of the run's backend (``nccl``,
``ipc`` or llmrl's ``llmrl_file``), which hands every received tensor, under its Hugging Face
name, to the model's ``load_weights``. vLLM then fuses and repacks them (q/k/v, gate/up, oneDNN
buffers), so the model's own parameters cannot be checksummed under the trainer's names. What
can: the tensors on their way in. :meth:`WeightAuditWorkerExtension.begin_weight_audit` puts a
recorder in front of the model's ``load_weights`` that fingerprints every tensor it is given
(:func:`~llmrl.core.weights_checksum.checksum_entry`, on the worker's device);
:meth:`WeightAuditWorkerExtension.end_weight_audit` removes it and returns the checksum of
what went in. It is the same recorder for every backend, and the same function the trainer
uses for what it sent, so an engine's checksum equals the trainer's exactly when every tensor
arrived intact.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from llmrl.core.weights_checksum import checksum_entry, combine_entries

WORKER_EXTENSION = "llmrl.policies.vllm_worker_extension.WeightAuditWorkerExtension"
"""The dotted name to pass to vLLM as ``worker_extension_cls``."""

Entry = tuple[str, str, tuple[int, ...], int]


class WeightAuditWorkerExtension:
    """Methods added to every vLLM worker to checksum what a weight push loads.

    Example (in the engine's process; :class:`~llmrl.policies.vllm_engine.VLLMEngine` does it):
        llm.collective_rpc("begin_weight_audit")
        llm.start_weight_update(); llm.update_weights(...); llm.finish_weight_update()
        [checksum] = llm.collective_rpc("end_weight_audit")  # one per worker
    """

    # Set by vLLM's worker, listed here for readers and type checkers.
    model_runner: Any

    def begin_weight_audit(self) -> None:
        """Record every tensor the model loads from now on (replaces an audit left open)."""
        model = self.model_runner.get_model()
        self._end_recording(model)
        entries: list[Entry] = []
        load = model.load_weights  # the class's bound method

        def recording_load(weights: Iterable[tuple[str, torch.Tensor]], *args: Any, **kw: Any):
            return load(_recorded(weights, entries), *args, **kw)

        model.load_weights = recording_load  # an instance attribute: what vLLM's engines call
        self._weight_audit_entries = entries

    def end_weight_audit(self) -> str:
        """Stop recording; the checksum of the tensors loaded since :meth:`begin_weight_audit`
        (:func:`~llmrl.core.weights_checksum.combine_entries`)."""
        model = self.model_runner.get_model()
        self._end_recording(model)
        entries = getattr(self, "_weight_audit_entries", None)
        if entries is None:
            raise RuntimeError("end_weight_audit without begin_weight_audit")
        self._weight_audit_entries = None
        return combine_entries(entries)

    @staticmethod
    def _end_recording(model: torch.nn.Module) -> None:
        model.__dict__.pop("load_weights", None)


def _recorded(
    weights: Iterable[tuple[str, torch.Tensor]], entries: list[Entry]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` as they are consumed, each one's checksum entry appended to ``entries``."""
    for name, tensor in weights:
        entries.append(checksum_entry(name, tensor))
        yield name, tensor
