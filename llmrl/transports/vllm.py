"""Weights straight into :class:`~llmrl.policies.vllm_engine.VLLMEngine` actors, through
vLLM's own weight-transfer engines.

One updater, :class:`VLLMWeightUpdater`, and one call sequence for every backend; only the
backend moves the bytes:

==============  ======================================================================
``backend``     how the tensors travel
==============  ======================================================================
``nccl``        vLLM's NCCL engine: the trainer (rank 0 of a group with every engine
                worker) broadcasts them from its GPU; engines on other GPUs or nodes
``ipc``         vLLM's CUDA IPC engine: every engine worker maps the trainer rank's
                tensors on its own GPU (the colocated layout: engines on the trainer's GPUs)
``llmrl_file``  llmrl's backend (:mod:`llmrl.policies.vllm_file_transfer`): one safetensors
                file in ``/dev/shm`` of the trainer's node, checked by SHA-256 (vLLM's CPU
                build; engines on the trainer's node)
==============  ======================================================================

A push (:meth:`VLLMWeightUpdater.push`):

1. every engine starts recording what its model loads (``begin_weight_audit``, see
   :mod:`llmrl.policies.vllm_worker_extension`);
2. vLLM's trainer engine of the backend (:func:`~llmrl.policies.vllm_transfer.trainer_engine`,
   made on the first push) sends the weights: ``start_weight_update``, ``update_weights``,
   ``finish_weight_update`` on every engine (:class:`~llmrl.policies.vllm_transfer.
   EngineClient`), each engine then dropping its prefix cache;
3. every engine returns the checksum of the tensors its model loaded (``end_weight_audit``):
   what the engine verified, compared with the trainer's by the audit;
4. the version is set in every engine and in the inference actors in front of them
   (``fronts``), which stamp it on their samples.

The whole push runs within ``push_timeout_s`` (``runtime.timeouts.weight_push_s``): a send that
outlives it (an engine stuck in an NCCL call leaves the trainer stuck in its broadcast) raises
:class:`~llmrl.core.deadlines.CallTimeout` naming the backend and the version.

Multi-rank trainers (``ipc`` under DDP: each rank shares its GPU's copy with the engine worker
on that GPU) build one updater per rank and push on every rank; rank 0 alone talks to the
engines.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, get_args

from llmrl.core.deadlines import CallTimeout, Hung
from llmrl.core.ray_helpers import free_port, import_ray
from llmrl.core.weights_checksum import weights_checksum
from llmrl.topology.spec import VLLMWeightBackend
from llmrl.transports.weights import (
    PUSH_SETTING,
    Delivery,
    Weights,
    WeightUpdater,
    as_state_dict,
    state_dict_bytes,
)

logger = logging.getLogger(__name__)

VLLM_BACKENDS: tuple[str, ...] = get_args(VLLMWeightBackend)

SENDER_GRACE_S = 2.0
"""How long past the push's deadline the trainer's side may take before it is declared hung (an
engine that hung is named by its own call's timeout at the deadline itself)."""


class VLLMWeightUpdater(WeightUpdater):
    """Pushes weights into vLLM engine actors through vLLM's weight-transfer engine of
    ``backend`` (see the module docstring).

    Args:
        engines: Ray actor handles of :class:`~llmrl.policies.vllm_engine.VLLMEngine`, built
            with ``weight_backend=backend``.
        backend: ``nccl``, ``ipc`` or ``llmrl_file``.
        fronts: the inference actors in front of the engines (their version is set).
        ranks_per_engine: workers per engine (its tensor-parallel size).
        rank: this trainer rank (0 sends; the others only take part in the trainer's
            collectives, ``ipc`` under several ranks).
        master_address: this process's address as the engines see it (``nccl``).
        master_port: the NCCL rendezvous port; None picks a free one.
        folder: where ``llmrl_file`` writes its files (None: ``/dev/shm``).
        source: the trainer model pushed by default.
    """

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        backend: str,
        fronts: Sequence[Any] = (),
        ranks_per_engine: int = 1,
        rank: int = 0,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        folder: str | None = None,
        source: Weights | None = None,
    ) -> None:
        super().__init__(source)
        if backend not in VLLM_BACKENDS:
            raise ValueError(
                f"vLLM weight backend must be one of {', '.join(VLLM_BACKENDS)}; got {backend!r}"
            )
        if not engines:
            raise ValueError("VLLMWeightUpdater needs at least one engine")
        if ranks_per_engine < 1:
            raise ValueError(f"ranks_per_engine must be >= 1, got {ranks_per_engine}")
        self.engines, self.fronts = list(engines), list(fronts)
        self.backend, self.ranks_per_engine, self.rank = backend, ranks_per_engine, rank
        self.master_address, self.master_port, self.folder = master_address, master_port, folder
        self._sender: Any = None
        self._version = 0

    @property
    def world_size(self) -> int:
        """The NCCL group: the trainer plus every engine worker."""
        return 1 + len(self.engines) * self.ranks_per_engine

    def _push(self, weights: Weights, version: int) -> Delivery:
        from llmrl.policies.vllm_transfer import StateSource

        self._version = version
        source = StateSource(as_state_dict(weights))
        sender = self._sender or self._within_deadline(lambda: self._connect(source), "connecting")
        sender.source = source  # vLLM's trainer engines replay their source on every send
        if self.rank != 0:
            sender.send_weights()
            return Delivery(0)
        self._on_engines("begin_weight_audit", "auditing")
        self._within_deadline(sender.send_weights, "sending")
        held = self._on_engines("end_weight_audit", "verifying")
        self._on_engines("set_weight_version", "stamping the version", version)
        if self.fronts:
            stamps = [front.set_version.remote(version) for front in self.fronts]
            self._await(stamps, version, "set_version", "stamping the version")
        return Delivery(state_dict_bytes(source.state), weights_checksum(source.state), tuple(held))

    def _connect(self, source: Any) -> Any:
        """vLLM's trainer engine of the backend, joined with the engines (first push)."""
        import_ray("Pushing weights to vLLM engine actors")
        from llmrl.policies.vllm_transfer import EngineClient, trainer_engine

        if self.backend == "nccl" and self.master_port is None:
            self.master_port = free_port()
        client = EngineClient(self.engines, self.ranks_per_engine, self._wait)
        self._sender = trainer_engine(
            self.backend,
            client,
            source,
            rank=self.rank,
            world_size=self.world_size,
            master_address=self.master_address,
            master_port=self.master_port or 0,
            folder=self.folder,
        )
        logger.info(
            "vLLM weight transfer (%s) ready: %d engine(s) x %d worker(s)",
            self.backend,
            len(self.engines),
            self.ranks_per_engine,
        )
        return self._sender

    def _wait(self, refs: list[Any], call: str, phase: str) -> list[Any]:
        return self._await(refs, self._version, call, phase)

    def _on_engines(self, method: str, phase: str, *args: Any) -> list[Any]:
        refs = [getattr(engine, method).remote(*args) for engine in self.engines]
        return self._await(refs, self._version, method, phase)

    def _within_deadline(self, work: Callable[[], Any], phase: str) -> Any:
        """``work()`` on a helper thread, waited for within the push's deadline: an engine
        stuck in a collective leaves the trainer's side stuck in it too, and only a wait
        from outside can give up on it."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = work()
            except BaseException as error:  # handed to the waiting thread
                outcome["error"] = error

        thread = threading.Thread(target=run, name=f"vllm-{self.backend}-{phase}", daemon=True)
        thread.start()
        deadline = getattr(self, "_deadline", None)
        left = deadline.left() if deadline is not None else self.push_timeout_s
        # the engines' calls inside have the same deadline and name the engine and the call;
        # this wait outlasts them a little, and only fires when the trainer's side is stuck
        thread.join(left + SENDER_GRACE_S)
        if thread.is_alive():
            hung = Hung(
                role="inference engines",
                call=f"vLLM weight transfer ({self.backend})",
                phase=phase,
                version=self._version,
                setting=PUSH_SETTING,
            )
            raise CallTimeout(hung, self.push_timeout_s)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def close(self) -> None:
        """Tear the trainer engine down (the next push joins again)."""
        if self._sender is not None:
            self._sender.shutdown()
        self._sender = None
