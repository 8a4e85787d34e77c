"""Loading a checkpoint into a model, optimizer and scheduler: reads files, writes none.

The format is described in :mod:`llmrl.train.checkpoint`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from llmrl.train.checkpoint_layout import (
    ADAPTER_DIR,
    MODEL_DIR,
    TrainState,
    latest_checkpoint,
    read_train_state,
    read_training_state,
)
from llmrl.train.checkpoint_rng import restore_rng_state
from llmrl.train.lora import is_peft_model

logger = logging.getLogger(__name__)


def load_checkpoint(
    path: str | Path,
    model: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    restore_rng: bool = True,
) -> TrainState:
    """Restore what is passed (model weights, optimizer, scheduler, RNG) from the complete
    checkpoint at ``path``; its :class:`TrainState`.

    Into a ``peft.PeftModel`` the adapter weights from ``adapter/`` are loaded; into a plain
    model, the (merged) weights from ``model/``, then the master weights when the
    checkpoint has them (a mixed-precision trainer's).

    Raises:
        FileNotFoundError: no such checkpoint, or it lacks the model's weights.
        ValueError: an incomplete checkpoint, weights that do not match the model, or an
            optimizer / scheduler asked for that the checkpoint was saved without.
    """
    path = Path(path)
    state = read_train_state(path)
    training = None
    if model is not None:
        _load_model_weights(path, model)
        if not is_peft_model(model):
            training = read_training_state(path)
            _load_master_weights(path, model, training.get("master_weights"))
    if optimizer is not None or scheduler is not None or restore_rng:
        training = training if training is not None else read_training_state(path)
        for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
            if target is None:
                continue
            if training.get(name) is None:
                raise ValueError(f"checkpoint {path} was saved without {name} state")
            target.load_state_dict(training[name])
        if restore_rng:
            restore_rng_state(training["rng"])
    logger.info("Loaded checkpoint %s (step %d)", path, state.step)
    return state


def resume_latest(
    folder: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> TrainState | None:
    """Load ``folder``'s newest complete checkpoint into the given objects (RNG included);
    ``None`` when there is none (a fresh start)."""
    latest = latest_checkpoint(folder)
    if latest is None:
        logger.info("No checkpoint in %s; starting from scratch", folder)
        return None
    return load_checkpoint(latest, model=model, optimizer=optimizer, scheduler=scheduler)


def _load_model_weights(path: Path, model: Any) -> None:
    from safetensors.torch import load_file

    if is_peft_model(model):
        _load_adapter(path, model)
        return
    files = sorted((path / MODEL_DIR).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path} has no safetensors weights in {MODEL_DIR}/")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    _load_all(model, weights, f"checkpoint {path}")


def _load_master_weights(path: Path, model: Any, masters: dict | None) -> None:
    """Put a mixed-precision trainer's float32 weights back over ``model/``'s cast ones."""
    if masters is not None:
        _load_all(model, masters, f"master weights of checkpoint {path}")


def _load_all(model: Any, weights: dict[str, torch.Tensor], what: str) -> None:
    """``weights`` into ``model``, every parameter covered (tied ones through their twin)."""
    result = model.load_state_dict(weights, strict=False)
    missing = _untied(model, set(result.missing_keys), loaded=set(weights))
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{what} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}"
        )


def _untied(model: torch.nn.Module, missing: set[str], loaded: set[str]) -> set[str]:
    """Missing keys that are not tied to (sharing storage with) a key that was loaded."""
    state = model.state_dict()
    loaded_storage = {state[name].data_ptr() for name in loaded if name in state}
    return {name for name in missing if state[name].data_ptr() not in loaded_storage}


def _load_adapter(path: Path, model: Any) -> None:
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    for name in model.peft_config:
        folder = path / ADAPTER_DIR if name == "default" else path / ADAPTER_DIR / name
        file = folder / "adapter_model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(
                f"checkpoint {path} has no weights for adapter {name!r} (expected {file}); "
                "was it saved from a PeftModel?"
            )
        result = set_peft_model_state_dict(model, load_file(file), adapter_name=name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(
                f"adapter {name!r} in {path} does not match the model: "
                f"unexpected {sorted(unexpected)[:5]}"
            )
