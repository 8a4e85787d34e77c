"""torch.distributed inside one trainer rank: the process group, model wrapping, full weights.

Every trainer rank (a Ray actor, :mod:`llmrl.runtime.trainer_rank`) calls :func:`init_group`
first: ``gloo`` on CPU, ``nccl`` on CUDA, rendezvous over TCP at the address rank 0 published.
A world of one rank is a group too, so checkpoint and weight code has one path.

Strategies (``topology.trainer.strategy``):

- ``single``: one rank, the model as it is.
- ``ddp``: ``DistributedDataParallel``; every rank holds the whole model, gradients are averaged
  in backward.
- ``fsdp``: FSDP2 (``fully_shard``) on every decoder layer, then on the root. Parameters are
  sharded across ranks and gathered per layer in forward and backward. FSDP2 frees a layer's
  gathered parameters after its forward, so the model must be called once per backward (the
  scoring path does; see :func:`llmrl.policies.response_scoring.score_responses`).

Full weights (for engines and checkpoints) come from :func:`full_state_dict`: one collective
gather under FSDP, the rank's own tensors otherwise; only rank 0 receives them, on CPU. vLLM's
GPU weight-transfer engines take them from :func:`device_state_dict` instead: on every rank,
on its device.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from llmrl.models.layers import decoder_layers, unwrapped
from llmrl.models.sharding import is_fully_sharded

logger = logging.getLogger(__name__)

STRATEGIES: tuple[str, ...] = ("single", "ddp", "fsdp")


def init_group(rank: int, world_size: int, address: str, port: int, timeout_s: float) -> str:
    """Join the trainer ranks' process group; returns the backend (``nccl`` or ``gloo``)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    logger.info("trainer rank %d/%d joined %s at %s:%d", rank, world_size, backend, address, port)
    return backend


def wrap_model(model: torch.nn.Module, strategy: str, mp_policy: Any = None) -> torch.nn.Module:
    """The module the loss calls: DDP around ``model``, or ``model`` itself sharded by FSDP2
    (with ``mp_policy``, FSDP2's ``MixedPrecisionPolicy``, when given: see
    :meth:`llmrl.train.precision.TrainingPrecision.fsdp_policy`)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; options: {list(STRATEGIES)}")
    if strategy == "single":
        return model
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        device = "cuda" if next(model.parameters()).is_cuda else "cpu"
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        options = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
        try:
            layers = decoder_layers(model)
        except ValueError as error:
            raise ValueError(f"{error}; FSDP shards them one by one: use strategy 'ddp'") from None
        for layer in layers:
            fully_shard(layer, **options)
        fully_shard(model, **options)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [model.device.index] if next(model.parameters()).is_cuda else None
    # No buffer broadcast at each forward: the model's buffers (rotary tables) are computed,
    # not trained, and ranks may call forward a different number of times per backward (the
    # shared-prompt pass), which would misalign that collective.
    return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside a DDP wrapper (an FSDP2 model is its own module)."""
    return unwrapped(model)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU, with Hugging Face names (LoRA adapters merged), on
    rank 0 (``{}`` elsewhere). Under FSDP every rank must call it (it gathers the shards);
    otherwise only rank 0 reads.
    """
    if is_fully_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    if dist.get_rank() != 0:
        return {}
    from llmrl.train.lora import inference_state_dict

    return inference_state_dict(unwrap(model))


def device_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on this rank's device, on every rank (Hugging Face names, LoRA
    adapters merged): what vLLM's ``nccl`` and ``ipc`` weight-transfer engines send from the
    GPU (``ipc``: each rank shares its own copy). Under FSDP every rank must call it (one
    gather, every layer whole on every rank's GPU at once); otherwise nothing is copied.
    """
    if is_fully_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        return get_model_state_dict(model, options=options)
    from llmrl.train.lora import is_peft_model, merged_state_dict

    inner = unwrap(model)
    state = merged_state_dict(inner) if is_peft_model(inner) else inner.state_dict()
    return {name: tensor.detach() for name, tensor in state.items()}


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, whole (not sharded): what any world size
    and strategy can load back with :func:`load_optimizer_state`. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load :func:`full_optimizer_state` output (every rank passes the whole state)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """``values`` summed over the ranks (a copy; unchanged with one rank)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def all_reduce_max(value: int) -> int:
    """The largest ``value`` of any rank (``value`` itself with one rank)."""
    return int(_all_reduce(torch.tensor([value], dtype=torch.int64), dist.ReduceOp.MAX).item())


def all_reduce_max_values(values: torch.Tensor) -> torch.Tensor:
    """``values`` elementwise maximised over the ranks (a copy; unchanged with one rank)."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def _all_reduce(values: torch.Tensor, op: Any) -> torch.Tensor:
    result = values.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        moved = result.to(_collective_device())
        dist.all_reduce(moved, op=op)
        result = moved.to(values.device)
    return result


def _collective_device() -> str:
    """Where the group's collectives take their tensors: CUDA for NCCL, else the CPU."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def world_size() -> int:
    """Ranks in the group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def leave_group() -> None:
    """Destroy the process group (idempotent)."""
    if dist.is_initialized():
        dist.destroy_process_group()
