"""How a trainer holds and computes a model whose ``model.dtype`` is below float32.

``model.dtype`` is the dtype the inference engines sample in and the dtype weights are pushed
and saved in. With ``model.precision: mixed`` (the default) a trainer does what TRL, veRL,
torchtitan and prime-rl do:

- **float32 master weights and AdamW state.** Pure bfloat16 AdamW adds each update to a
  bfloat16 weight, whose 8-bit mantissa spaces neighbouring values ~0.4% of the weight apart:
  an update smaller than half of that is rounded away (measured on an H100: one GRPO step at
  lr 1e-6 changed few of a bfloat16 model's weight elements and nearly all in float32,
  docs/measurements.md#bfloat16-updates-rounded-away).
- **compute in ``dtype``**: ``torch.autocast`` around the forward and loss (single process and
  DDP); under FSDP2 its ``MixedPrecisionPolicy`` (parameters gathered in ``dtype``, gradients
  reduced in float32) instead.
- **casts at the edges**: pushed and saved weights are the masters cast to ``dtype``
  (:meth:`TrainingPrecision.export`); checkpoints also keep the masters themselves, so a resume
  continues from the exact weights.

A LoRA model keeps its frozen base in ``dtype`` (it gets no updates to round away) and its
adapters in float32 (peft's ``autocast_adapter_dtype``).

``precision: pure`` keeps parameters and AdamW state in ``dtype``: half the memory of the
masters, at the cost above; the stage logs a warning saying so.

Example:
    precision = TrainingPrecision.of(config.model)
    model = load_model(spec, dtype=precision.load_dtype(lora=False))   # float32 masters
    with precision.autocast(model):
        loss = loss_fn(batch)
    engine_weights = precision.export(model.state_dict())              # bfloat16
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from llmrl.config.common import ModelConfig
from llmrl.models.loading import as_dtype

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingPrecision:
    """The dtypes of one trainer (see the module docstring).

    Attributes:
        dtype: ``model.dtype``: sampling, pushed and saved weights, and the compute dtype.
        mixed: float32 masters and optimizer state (``model.precision: mixed``).
    """

    dtype: torch.dtype
    mixed: bool = True

    @classmethod
    def of(cls, model: ModelConfig) -> TrainingPrecision:
        """The precision a stage's ``model`` section asks for."""
        return cls(dtype=as_dtype(model.dtype), mixed=model.precision == "mixed")

    @property
    def master_dtype(self) -> torch.dtype:
        """The dtype of trained parameters and of the optimizer state."""
        return torch.float32 if self.mixed else self.dtype

    @property
    def casts(self) -> bool:
        """Whether compute runs in a dtype other than the trained parameters' (autocast)."""
        return self.mixed and self.dtype != torch.float32

    def load_dtype(self, lora: bool) -> torch.dtype:
        """The dtype to load the model in: the masters', or ``dtype`` for a LoRA base (frozen;
        its float32 adapters are the masters)."""
        return self.dtype if lora else self.master_dtype

    def autocast(self, model: torch.nn.Module) -> AbstractContextManager[Any]:
        """``torch.autocast`` to ``dtype`` on ``model``'s device type, when masters and compute
        differ; a no-op otherwise and for an FSDP2 model (its policy casts)."""
        from llmrl.models.sharding import is_fully_sharded

        if not self.casts or is_fully_sharded(model):
            return nullcontext()
        device_type = next(model.parameters()).device.type
        return torch.autocast(device_type=device_type, dtype=self.dtype)

    def fsdp_policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` (parameters gathered in ``dtype``, gradients reduced
        in float32), or None when nothing is cast."""
        if not self.casts:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)

    def export(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` with its floating-point tensors cast to ``dtype`` (the weights engines load
        and checkpoints hold in ``model/``); tensors already in ``dtype`` are not copied, and
        names that share one tensor (tied embeddings) still share its cast."""
        cast: dict[tuple, torch.Tensor] = {}
        exported = {}
        for name, tensor in state.items():
            if not tensor.is_floating_point() or tensor.dtype == self.dtype:
                exported[name] = tensor
                continue
            view = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.device)
            if view not in cast:
                cast[view] = tensor.to(self.dtype)
            exported[name] = cast[view]
        return exported

    def checkpoint_weights(
        self, model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
        """What a checkpoint (:class:`~llmrl.train.checkpoint.CheckpointPayload`) holds for
        ``model`` (whose full weights are ``state`` when given, e.g. gathered from FSDP shards):
        ``(model_state, master_weights)``, the weights of ``model/`` (None: the model's own)
        and the masters to keep beside them (None: ``model/`` holds them exactly). A LoRA
        model saves its merged weights and float32 adapters itself: ``(None, None)``."""
        from llmrl.train.lora import is_peft_model

        if is_peft_model(model):
            return None, None
        if not self.casts:
            return state, None
        masters = state if state is not None else model.state_dict()
        return self.export(masters), masters

    def warn_if_pure(self) -> None:
        """Log what ``precision: pure`` costs, once per stage."""
        if not self.mixed and self.dtype != torch.float32:
            half_spacing = torch.finfo(self.dtype).eps / 2  # relative, at a weight's value
            logger.warning(
                "model.precision: pure: parameters and AdamW state are %s; updates smaller than "
                "about %.2g%% of a weight are rounded away (set model.precision: mixed for "
                "float32 master weights)",
                str(self.dtype).removeprefix("torch."),
                100 * half_spacing,
            )
