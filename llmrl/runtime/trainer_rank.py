"""`TrainerRank`: one torch.distributed rank of the GRPO trainer, run as a Ray actor.

The driver (:class:`~llmrl.runtime.trainer_group.TrainerGroup`) starts one per
``topology.trainer.world_size`` and calls the same method on every rank at once; the ranks
meet in collectives (gradient averaging, FSDP gathers, the loss normalizer). Rank 0 also:

- pushes the full weights to the inference engines after each optimizer step through its
  weight transport (:mod:`llmrl.transports`, chosen by ``topology.weight_transport``), so
  weights never pass through the driver;
- writes checkpoints (Hugging Face weights, the whole optimizer state keyed by parameter name,
  so any world size and strategy resumes from them): it holds the checkpoint folder's one
  :class:`~llmrl.train.checkpoint.CheckpointWriter` and recovers the folder in ``setup``; the
  driver and the other ranks only read it.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.train import distributed
from llmrl.train.precision import TrainingPrecision
from llmrl.transports.weights import WeightSyncStats

logger = logging.getLogger(__name__)


class TrainerRank:
    """Rank ``rank`` of ``world_size`` (see the module docstring).

    Args:
        config: the stage config.
        rank, world_size: this rank and the number of ranks.
        strategy: ``single``, ``ddp`` or ``fsdp``.
        total_optimizer_steps: optimizer steps of the whole run (the schedule's length).
        reference_with_trainer: hold a frozen reference and score each shard with it.
        threads: torch CPU threads (None: torch's default).
    """

    def __init__(
        self,
        *,
        config: GRPOConfig,
        rank: int,
        world_size: int,
        strategy: str,
        total_optimizer_steps: int,
        reference_with_trainer: bool,
        threads: int | None = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        if threads:
            torch.set_num_threads(threads)
        self.config = config
        self.rank, self.world_size, self.strategy = rank, world_size, strategy
        self.total_optimizer_steps = total_optimizer_steps
        self.reference_with_trainer = reference_with_trainer
        self.trainer: Any = None
        self.reference: Any = None
        self.weight_updater: Any = None
        self.push_from_device = False  # vLLM's nccl / ipc engines: see connect_engines
        self.checkpoints: Any = None
        self.precision = TrainingPrecision.of(config.model)

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port on it (asked of rank 0 for the group)."""
        from llmrl.core.ray_helpers import free_port

        return _node_address(), free_port()

    def setup(self, address: str, port: int, resume_from: str | None) -> int:
        """Join the group, build the model (from ``resume_from``'s weights when given), wrap it
        for the strategy and build the optimizer; returns the rank's parameter count."""
        from llmrl.core.seeding import seed_everything
        from llmrl.models import load_tokenizer
        from llmrl.train.grpo_trainer import GRPOTrainer
        from llmrl.train.trainable_model import load_trainable_model

        config = self.config
        seed_everything(config.seed)  # every rank alike: the same LoRA init, the same draws
        distributed.init_group(
            self.rank, self.world_size, address, port, config.runtime.collective_timeout_s
        )
        self.tokenizer = load_tokenizer(
            config.model.spec, trust_remote_code=config.model.trust_remote_code
        )
        if self.rank == 0:
            self.precision.warn_if_pure()
        model = load_trainable_model(config.model, config.lora)  # float32 masters when mixed
        if resume_from is not None:  # its masters too: the exact weights it stopped at
            from llmrl.train.checkpoint import load_checkpoint

            load_checkpoint(resume_from, model=model)
        wrapped = distributed.wrap_model(model, self.strategy, self.precision.fsdp_policy())
        self.trainer = GRPOTrainer(config, wrapped, self.tokenizer, self.total_optimizer_steps)
        if resume_from is not None:
            self._load_training_state(resume_from)
        self._own_checkpoints(resume_from)
        if self.reference_with_trainer:
            from llmrl.runtime.reference import ReferenceScorer

            self.reference = ReferenceScorer(
                model=config.model.spec,
                dtype=config.model.dtype,
                device=config.model.device,
                load_options=config.model.load_options,
                packing=config.model.packing,
            )
        logger.info(
            "trainer rank %d/%d ready (%s%s)",
            self.rank,
            self.world_size,
            self.strategy,
            f", resumed from {resume_from}" if resume_from else "",
        )
        return sum(p.numel() for p in wrapped.parameters())

    def connect_engines(
        self,
        inference_actors: list[Any],
        vllm_engines: list[Any],
        ranks_per_engine: int,
        transport: str = "auto",
        colocated: bool = False,
    ) -> None:
        """The weight updater towards the engines, as ``topology.weight_transport`` says
        (:func:`~llmrl.transports.selection.make_weight_updater`): rank 0's; the other ranks
        have one only for vLLM's ``ipc`` engine, where each shares its GPU's copy."""
        from llmrl.transports.selection import engine_weight_backend, make_weight_updater

        if self.config.lora.pushes_adapter:  # rank 0 sends the adapter alone
            if self.rank == 0:
                self.weight_updater = self._adapter_updater(inference_actors, vllm_engines)
            return
        backend = engine_weight_backend(transport, colocated, torch.cuda.is_available())
        # vLLM's own engines send from the GPU; every rank gathers alike (FSDP)
        self.push_from_device = bool(vllm_engines) and backend in ("nccl", "ipc")
        if self.rank != 0 and not (vllm_engines and backend == "ipc"):
            return
        runtime = self.config.runtime
        self.weight_updater = make_weight_updater(
            transport,
            inference_actors,
            vllm_engines,
            ranks_per_engine,
            _node_address(),
            push_timeout_s=runtime.timeouts.weight_push_s,
            collective_timeout_s=runtime.collective_timeout_s,
            colocated=colocated,
            rank=self.rank,
        )

    def _adapter_updater(self, inference_actors: list[Any], vllm_engines: list[Any]) -> Any:
        """Rank 0's updater of ``lora.sync: adapter``: the adapter to the vLLM engines (their
        front actors stamp the version) or to the transformers inference actors."""
        from llmrl.transports.lora_adapter import AdapterWeightUpdater

        base = distributed.unwrap(self.trainer.model).get_base_model()
        elements = sum(p.numel() for n, p in base.named_parameters() if ".lora_" not in n)
        updater = AdapterWeightUpdater(
            vllm_engines or inference_actors,
            lora_config=self.config.lora.adapter_config(),
            fronts=inference_actors if vllm_engines else (),
            merged_bytes=elements * self.precision.dtype.itemsize,  # tied weights once
        )
        updater.push_timeout_s = self.config.runtime.timeouts.weight_push_s
        return updater

    def train(
        self, shard: TensorDictBase, minibatches: int, step: int, stand_in_only: bool
    ) -> dict[str, float]:
        """Score ``shard`` with the reference (when held here), then train on it."""
        if self.reference is not None:
            shard = self.reference(shard)
        return self.trainer.train(shard, minibatches, step=step, stand_in_only=stand_in_only)

    def push_weights(self, version: int) -> WeightSyncStats | None:
        """Send the current weights, cast to ``model.dtype``, to the engines as ``version``;
        the push's stats (rank 0; None elsewhere)."""
        model = self.trainer.model
        if self.config.lora.pushes_adapter:  # every rank holds the same adapter
            if self.weight_updater is None:
                return None
            from llmrl.models.adapters import adapter_state

            adapter = adapter_state(distributed.unwrap(model))
            return self.weight_updater.push(self.precision.export(adapter), version=version)
        if self.push_from_device:  # every rank, on its GPU (collective under FSDP)
            weights = distributed.device_state_dict(model)
        else:  # rank 0, on CPU (collective under FSDP)
            weights = distributed.full_state_dict(model)
        if self.weight_updater is None:
            return None
        stats = self.weight_updater.push(self.precision.export(weights), version=version)
        return stats if self.rank == 0 else None

    def restore_engine(self, old: Any, new: Any) -> bool:
        """Rank 0: load the last pushed weights into a rebuilt inference actor ``new``;
        whether its updater could (an NCCL updater cannot)."""
        return self.rank == 0 and self.weight_updater.restore(old, new)

    def save(self, step: int, extra: dict[str, Any], metrics: dict[str, float]) -> str | None:
        """Write the checkpoint of ``step`` (rank 0 writes; every rank gathers); its path."""
        model = self.trainer.model
        sharded = distributed.is_fully_sharded(model)
        full = None
        if sharded:  # save_pretrained cannot read a sharded model: give it the gathered weights
            full = _without_tied_copies(model, distributed.full_state_dict(model))
        optimizer_state = distributed.full_optimizer_state(model, self.trainer.optimizer)
        if self.rank != 0:
            return None
        # model/ in model.dtype; the float32 masters beside it under mixed precision
        model_state, masters = self.precision.checkpoint_weights(distributed.unwrap(model), full)
        from llmrl.train.checkpoint import CheckpointPayload

        payload = CheckpointPayload(
            step=step,
            model=distributed.unwrap(model),
            tokenizer=self.tokenizer,
            optimizer_state=optimizer_state,  # gathered: every parameter's, by name
            scheduler=self.trainer.scheduler,
            extra=extra,
            metrics=metrics,
            model_state=model_state,
            master_weights=masters,
        )
        return str(self.checkpoints.save(payload))

    def shutdown(self) -> None:
        """Leave the process group."""
        distributed.leave_group()

    def _own_checkpoints(self, resume_from: str | None) -> None:
        """Rank 0: become the checkpoint folder's one writer and recover it, once every rank
        has read ``resume_from`` (recovery may move a checkpoint a crashed save left aside)."""
        if resume_from is not None:
            distributed.all_reduce_max(0)  # a barrier: every rank is done reading resume_from
        if self.rank != 0:
            return
        from llmrl.train.checkpoint import CheckpointWriter

        self.checkpoints = CheckpointWriter.from_config(self.config.checkpoint)
        self.checkpoints.recover()

    def _load_training_state(self, path: str) -> None:
        from llmrl.train.checkpoint import read_training_state

        state = read_training_state(path)
        distributed.load_optimizer_state(
            self.trainer.model, self.trainer.optimizer, state["optimizer"]
        )
        self.trainer.scheduler.load_state_dict(state["scheduler"])


def _without_tied_copies(model: torch.nn.Module, state: dict) -> dict:
    """``state`` without the second name of tied weights (``lm_head.weight`` when it is the
    embedding), as ``save_pretrained`` writes a plain model."""
    own = {name for name, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {name: tensor for name, tensor in state.items() if name in own}


def _node_address() -> str:
    """This node's IP as other Ray nodes reach it."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray: this machine
        return socket.gethostbyname(socket.gethostname())
