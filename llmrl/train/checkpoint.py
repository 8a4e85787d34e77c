"""Crash-safe training checkpoints: save, retain, find the newest complete one, resume.

A checkpoint is a directory ``<directory>/step-000120/`` holding:

* ``model/`` -- the model's ``save_pretrained`` output (safetensors) plus the tokenizer's, so
  ``load_model("<directory>/step-000120/model")`` works directly. For a ``peft.PeftModel`` this
  is the *merged* full model (merged weight by weight, :func:`llmrl.train.lora.merged_state_dict`:
  the model is neither copied nor modified), and ``adapter/`` holds the adapter's own
  ``save_pretrained``.
* ``training_state.pt`` -- optimizer and scheduler state dicts and the torch / CUDA / python
  ``random`` / numpy RNG states (``torch.save``; loadable with ``weights_only=True``); under
  mixed precision also the float32 master weights (``model/`` holds them cast to
  ``model.dtype``), which :meth:`CheckpointManager.load` puts back so a resume is exact.
* ``trainer_state.json`` -- step, loop-specific ``extra`` state, metrics, time, llmrl version.
* ``COMPLETE`` -- written last; a directory without it is never resumed from.

Every checkpoint is written as ``.step-000120.tmp-<random>`` in the same directory, fsynced,
and renamed into place, so a crash at any moment leaves either the previous checkpoints
untouched or the new one complete. Replacing an existing step moves the old directory aside
(``.step-000120.old-<random>``) before renaming the new one in; a manager started after a crash
between those two renames puts the old one back. Pruned checkpoints are renamed to a temporary
name before deletion, so a half-deleted directory never looks complete. One manager
(one process, e.g. rank 0) writes to a directory at a time.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from llmrl.core.faults import fault_point
from llmrl.train.lora import is_peft_model, merged_state_dict

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
MODEL_DIR = "model"
ADAPTER_DIR = "adapter"
TRAINING_STATE_FILE = "training_state.pt"
TRAINER_STATE_FILE = "trainer_state.json"
FORMAT_VERSION = 1

_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_DIR = re.compile(r"^\.step-\d+\.tmp-")
_OLD_DIR = re.compile(r"^\.(step-\d+)\.old-")
# Temporary directories last modified before this moment were left by an earlier process.
_PROCESS_STARTED = time.time()


@dataclass
class TrainState:
    """What a training loop needs to continue from a checkpoint.

    Example:
        >>> state = manager.resume(model, optimizer, scheduler)
        >>> start = state.step + 1 if state is not None else 0
    """

    step: int
    extra: dict = field(default_factory=dict)
    """Loop-specific JSON-able state (collector / primer counters, best metric so far, ...)."""
    metrics: dict = field(default_factory=dict)
    """Metrics recorded at that step."""


class CheckpointManager:
    """Write, list, prune and load checkpoints under one directory.

    Keeps the ``keep_last`` newest checkpoints plus the best one by ``best_metric`` (taken from
    the ``metrics`` passed to :meth:`save`; ``best_mode`` is ``"max"`` or ``"min"``; on a tie
    the newer checkpoint wins). Creating a manager removes temporary directories left by a
    crashed save of an earlier process.

    Example:
        >>> manager = CheckpointManager("runs/sft/checkpoints", keep_last=2, best_metric="reward")
        >>> state = manager.resume(model, optimizer, scheduler)  # None on a fresh run
        >>> manager.save(step, model, tokenizer, optimizer, scheduler,
        ...              extra={"samples_seen": n}, metrics={"reward": 0.4})
    """

    def __init__(
        self,
        directory: str | Path,
        keep_last: int = 2,
        best_metric: str | None = None,
        best_mode: str = "max",
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.directory = Path(directory)
        self.keep_last, self.best_metric, self.best_mode = keep_last, best_metric, best_mode
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    def list(self) -> list[Path]:
        """The complete checkpoints, oldest step first."""
        found = []
        for entry in self.directory.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir() and (entry / COMPLETE_MARKER).is_file():
                found.append((int(match.group(1)), entry))
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        """The complete checkpoint with the highest step, or ``None`` when there is none."""
        complete = self.list()
        return complete[-1] if complete else None

    def best(self) -> Path | None:
        """The complete checkpoint with the best ``best_metric`` (``None`` if not tracked)."""
        if self.best_metric is None:
            return None
        chosen, chosen_value = None, math.nan
        for path in self.list():  # oldest first: on a tie the newer one wins
            metrics = json.loads((path / TRAINER_STATE_FILE).read_text())["metrics"]
            value = metrics.get(self.best_metric)
            if not isinstance(value, (int, float)) or math.isnan(value):
                continue
            better = value >= chosen_value if self.best_mode == "max" else value <= chosen_value
            if chosen is None or better:
                chosen, chosen_value = path, value
        return chosen

    def save(
        self,
        step: int,
        model: Any,
        tokenizer: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        extra: dict | None = None,
        metrics: dict | None = None,
        model_state: dict[str, torch.Tensor] | None = None,
        master_weights: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        """Write the checkpoint for ``step`` atomically, then prune old ones; return its path.

        Saving a step that already exists replaces it. The RNG states are captured first, so
        saving does not shift what the training loop draws next. ``optimizer`` may be an
        optimizer or its state dict already gathered (a sharded trainer's); ``model_state``
        replaces the model's own state dict in ``model/`` (the gathered weights of a sharded
        model, or weights cast to the model's dtype); ``master_weights`` (the full-precision
        weights of a mixed-precision trainer, by state-dict name) go into ``training_state.pt``
        and are loaded back over ``model/``'s by :meth:`load`.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        rng = _capture_rng()
        extra, metrics = dict(extra or {}), dict(metrics or {})
        if self.best_metric is not None and self.best_metric not in metrics:
            raise ValueError(
                f"best_metric {self.best_metric!r} is missing from the metrics passed to "
                f"save(step={step}): got {sorted(metrics)}"
            )
        trainer_state = {
            "step": step,
            "extra": extra,
            "metrics": metrics,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "llmrl_version": _llmrl_version(),
            "format_version": FORMAT_VERSION,
            "peft": _is_peft(model),
        }
        trainer_json = _to_json(trainer_state, what=f"extra/metrics of step {step}")

        target = self.directory / f"step-{step:06d}"
        staging = self.directory / f".{target.name}.tmp-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            self._write_model(staging, model, tokenizer, model_state)
            self._write_training_state(
                staging / TRAINING_STATE_FILE, optimizer, scheduler, rng, master_weights
            )
            fault_point("checkpoint_write", step)  # crash tests: weights written, no marker
            (staging / TRAINER_STATE_FILE).write_text(trainer_json)
            (staging / COMPLETE_MARKER).write_text(f"step {step}\n")
            _fsync_tree(staging)  # everything is durable before the rename makes it visible
            fault_point("checkpoint_write", step)  # crash tests: complete, not renamed
            self._publish(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        logger.info("Saved checkpoint %s", target)
        if any(int(p.name[5:]) > step for p in self.list()):
            logger.warning(
                "Saved step %d below newer checkpoints; latest() is %s", step, self.latest()
            )
        self._prune(keep=target)
        return target

    def _write_model(
        self, staging: Path, model: Any, tokenizer: Any, model_state: dict | None
    ) -> None:
        model_dir = staging / MODEL_DIR
        if model_state is not None:
            model.save_pretrained(model_dir, state_dict=model_state)
        elif _is_peft(model):
            # Merged weights computed layer by layer: the caller keeps training the adapter.
            base = model.get_base_model()
            base.save_pretrained(model_dir, state_dict=merged_state_dict(model))
            model.save_pretrained(staging / ADAPTER_DIR)
        else:
            model.save_pretrained(model_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)

    def _write_training_state(
        self, path: Path, optimizer: Any, scheduler: Any, rng: dict, master_weights: dict | None
    ) -> None:
        state = {
            "optimizer": optimizer if isinstance(optimizer, dict) else _state_of(optimizer),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng,
        }
        if master_weights is not None:
            state["master_weights"] = {k: v.detach().cpu() for k, v in master_weights.items()}
        torch.save(state, path)

    def _publish(self, staging: Path, target: Path) -> None:
        """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first."""
        if not target.exists():
            os.rename(staging, target)
            _fsync_dir(self.directory)
            return
        aside = self.directory / f".{target.name}.old-{secrets.token_hex(4)}"
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except OSError:
            os.rename(aside, target)
            raise
        _fsync_dir(self.directory)
        logger.info("Replaced existing checkpoint %s", target)
        shutil.rmtree(aside, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        """Delete complete checkpoints beyond the newest ``keep_last``, the best and ``keep``."""
        complete = self.list()
        kept = {*complete[-self.keep_last :], keep}
        best = self.best()
        if best is not None:
            kept.add(best)
        for path in complete:
            if path not in kept:
                try:
                    self._delete(path)
                    logger.info("Pruned checkpoint %s", path)
                except OSError as error:
                    logger.warning("Could not prune checkpoint %s: %s", path, error)

    def _delete(self, path: Path) -> None:
        # Rename first, so a crash mid-delete leaves a temporary dir, not a broken checkpoint.
        doomed = self.directory / f".{path.name}.tmp-delete-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        _fsync_dir(self.directory)
        shutil.rmtree(doomed)

    def _recover(self) -> None:
        """Undo what a crashed save of an earlier process left behind."""
        for entry in sorted(self.directory.iterdir()):
            if not entry.is_dir():
                continue
            if _TMP_DIR.match(entry.name) and entry.stat().st_mtime < _PROCESS_STARTED:
                shutil.rmtree(entry, ignore_errors=True)
                logger.warning("Removed stale temporary checkpoint %s (a crashed save)", entry)
                continue
            old = _OLD_DIR.match(entry.name)
            if old is None:
                continue
            target = self.directory / old.group(1)
            if not target.exists() and (entry / COMPLETE_MARKER).is_file():
                os.rename(entry, target)
                _fsync_dir(self.directory)
                logger.warning("Restored checkpoint %s (a crashed replacement moved it)", target)
            else:
                shutil.rmtree(entry, ignore_errors=True)
                logger.warning("Removed replaced checkpoint %s (a crashed replacement)", entry)

    def load(
        self,
        path: str | Path,
        model: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        restore_rng: bool = True,
    ) -> TrainState:
        """Restore what is passed (model weights, optimizer, scheduler, RNG) from ``path``.

        Into a ``peft.PeftModel`` the adapter weights from ``adapter/`` are loaded; into a plain
        model, the (merged) weights from ``model/``, then the master weights when the
        checkpoint has them (a mixed-precision trainer's).
        """
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        if not (path / COMPLETE_MARKER).is_file():
            raise ValueError(
                f"incomplete checkpoint {path}: written by a process that did not finish "
                f"(no {COMPLETE_MARKER} marker); resume from a complete one instead"
            )
        info = json.loads((path / TRAINER_STATE_FILE).read_text())
        training = None
        if model is not None:
            _load_model_weights(path, model)
            if not _is_peft(model):
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
                _restore_rng(training["rng"])
        logger.info("Loaded checkpoint %s (step %d)", path, info["step"])
        return TrainState(step=info["step"], extra=info["extra"], metrics=info["metrics"])

    def resume(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
    ) -> TrainState | None:
        """Load :meth:`latest` into the given objects; ``None`` when there is no checkpoint."""
        latest = self.latest()
        if latest is None:
            logger.info("No checkpoint in %s; starting from scratch", self.directory)
            return None
        return self.load(latest, model=model, optimizer=optimizer, scheduler=scheduler)


def read_training_state(path: str | Path) -> dict:
    """A checkpoint's ``training_state.pt``: optimizer, scheduler and RNG states."""
    return torch.load(Path(path) / TRAINING_STATE_FILE, map_location="cpu", weights_only=True)


def _state_of(stateful: Any) -> dict | None:
    return stateful.state_dict() if stateful is not None else None


def _is_peft(model: Any) -> bool:
    return is_peft_model(model)


def _load_model_weights(path: Path, model: Any) -> None:
    from safetensors.torch import load_file

    if _is_peft(model):
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


def _capture_rng() -> dict:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        legacy = numpy.random.get_state(legacy=False)
        # Keep the key as a tensor, so the file loads with torch.load(weights_only=True).
        legacy["state"]["key"] = torch.from_numpy(legacy["state"]["key"].astype("int64"))
        state["numpy"] = legacy
    return state


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            logger.warning("Not restoring CUDA RNG: saved for %d devices", len(state["cuda"]))
    if "numpy" in state:
        import numpy

        saved = copy.deepcopy(state["numpy"])
        saved["state"]["key"] = saved["state"]["key"].numpy().astype("uint32")
        numpy.random.set_state(saved)


def _to_json(value: dict, what: str) -> str:
    def scalar(obj: Any) -> Any:
        if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
            return obj.item()  # torch / numpy scalars, common in metrics
        raise TypeError(f"{what} must be JSON-serialisable; got {type(obj).__name__}: {obj!r}")

    return json.dumps(value, indent=2, sort_keys=True, default=scalar)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (``root`` included)."""
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return  # directories cannot be opened for fsync on Windows
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _llmrl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmrl")
    except PackageNotFoundError:
        return "unknown"
