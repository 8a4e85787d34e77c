"""Writing checkpoints: what one holds (:class:`CheckpointPayload`) and the one writer of a
folder (:class:`CheckpointWriter`): atomic saves, retention, recovery after a crash.

The format and the crash-safety rules are described in :mod:`llmrl.train.checkpoint`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from llmrl.config.common import CheckpointConfig
from llmrl.core.faults import fault_point
from llmrl.train.checkpoint_layout import (
    ADAPTER_DIR,
    COMPLETE_MARKER,
    FORMAT_VERSION,
    MODEL_DIR,
    OLD_DIR,
    TMP_DIR,
    TRAINER_STATE_FILE,
    TRAINING_STATE_FILE,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    moved_aside,
    step_dir_name,
)
from llmrl.train.checkpoint_rng import capture_rng_state
from llmrl.train.lora import is_peft_model, merged_state_dict

logger = logging.getLogger(__name__)

# Temporary directories last modified before this moment were left by an earlier process.
_PROCESS_STARTED = time.time()


@dataclass(frozen=True)
class CheckpointPayload:
    """What one checkpoint holds (the files are described in :mod:`llmrl.train.checkpoint`).

    The optimizer comes either live, as ``optimizer`` (its ``state_dict()`` is written), or
    already gathered, as ``optimizer_state`` (a sharded trainer's whole state,
    :func:`llmrl.train.distributed.full_optimizer_state`); never both. The RNG states are
    captured when the payload is made, before anything is written, so saving does not shift
    what the training loop draws next.

    Raises:
        TypeError: a field of the wrong type (the message names the field).
        ValueError: a negative step, or both ``optimizer`` and ``optimizer_state``.
    """

    step: int
    """Steps done when saved: a resumed loop continues with ``range(step, steps)``."""
    model: Any
    """The unwrapped model: ``model/`` is its ``save_pretrained`` (a ``peft.PeftModel``:
    merged weights in ``model/``, its adapter in ``adapter/``)."""
    tokenizer: Any = None
    """Saved into ``model/`` beside the weights when given."""
    optimizer: torch.optim.Optimizer | None = None
    optimizer_state: dict[str, Any] | None = None
    scheduler: Any = None
    """A learning-rate scheduler (anything with ``state_dict``)."""
    model_state: dict[str, torch.Tensor] | None = None
    """Replaces the model's own state dict in ``model/``: the gathered weights of a sharded
    model, or weights cast to the model's dtype."""
    master_weights: dict[str, torch.Tensor] | None = None
    """A mixed-precision trainer's full-precision weights by state-dict name, kept in
    ``training_state.pt`` and loaded back over ``model/``'s."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Loop-specific JSON-able state (collector counters, the MLflow run, ...)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """JSON-able metrics of the step (retention's ``best_metric`` is read from them)."""
    rng: dict[str, Any] = field(default_factory=capture_rng_state)
    """The generator states to restore on resume (default: this process's, now)."""

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int):
            raise TypeError(f"step must be an int, got {type(self.step).__name__}: {self.step!r}")
        if self.step < 0:
            raise ValueError(f"step must be non-negative, got {self.step}")
        if not hasattr(self.model, "save_pretrained"):
            raise TypeError(
                "model must be a transformers or peft model (it needs save_pretrained), "
                f"got {type(self.model).__name__}"
            )
        if self.optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            hint = ""
            if isinstance(self.optimizer, dict):
                hint = "; pass a state dict already gathered as optimizer_state="
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got "
                f"{type(self.optimizer).__name__}{hint}"
            )
        if self.optimizer is not None and self.optimizer_state is not None:
            raise ValueError("give optimizer or optimizer_state (already gathered), not both")
        if self.scheduler is not None and not hasattr(self.scheduler, "state_dict"):
            raise TypeError(
                f"scheduler must have state_dict(), got {type(self.scheduler).__name__}"
            )
        for name in ("optimizer_state", "model_state", "master_weights", "extra", "metrics"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"{name} must be a dict, got {type(value).__name__}")

    def trainer_state_json(self) -> str:
        """``trainer_state.json``'s text: step, extra, metrics, time, versions."""
        state = {
            "step": self.step,
            "extra": dict(self.extra),
            "metrics": dict(self.metrics),
            "created_at": datetime.now(timezone.utc).isoformat(),
            "llmrl_version": _llmrl_version(),
            "format_version": FORMAT_VERSION,
            "peft": is_peft_model(self.model),
        }
        return _to_json(state, what=f"extra/metrics of step {self.step}")


class CheckpointWriter:
    """The one writer of a checkpoint folder: saves, retention, recovery after a crash.

    One process writes to a folder at a time (rank 0 of the GRPO trainer, the SFT stage's
    process); anyone reads it with :func:`~llmrl.train.checkpoint_layout.latest_checkpoint`
    and :func:`~llmrl.train.checkpoint_load.load_checkpoint`. Making a writer touches nothing;
    :meth:`recover` (required before the first :meth:`save`) creates the folder and undoes
    what a crashed save of an earlier process left.

    Retention keeps the ``keep_last`` newest checkpoints plus the best one by ``best_metric``
    (taken from the payload's ``metrics``; ``best_mode`` is ``"max"`` or ``"min"``; on a tie
    the newer checkpoint wins).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        keep_last: int = 2,
        best_metric: str | None = None,
        best_mode: str = "max",
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.folder = Path(folder)
        self.keep_last, self.best_metric, self.best_mode = keep_last, best_metric, best_mode
        self._recovered = False

    @classmethod
    def from_config(cls, settings: CheckpointConfig) -> CheckpointWriter:
        """The writer of ``settings.dir`` with the configured retention (not yet recovered)."""
        return cls(
            settings.dir,
            keep_last=settings.keep_last,
            best_metric=settings.best_metric,
            best_mode=settings.best_mode,
        )

    def recover(self) -> None:
        """Create the folder if needed and undo what a crashed save of an earlier process
        left: stale temporary directories are deleted, a checkpoint a crashed replacement
        moved aside is put back (or deleted when its step exists)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        restore = {aside: target for target, aside in moved_aside(self.folder).items()}
        for entry in sorted(self.folder.iterdir()):
            if not entry.is_dir():
                continue
            if TMP_DIR.match(entry.name) and entry.stat().st_mtime < _PROCESS_STARTED:
                shutil.rmtree(entry, ignore_errors=True)
                logger.warning("Removed stale temporary checkpoint %s (a crashed save)", entry)
            elif entry in restore:
                os.rename(entry, restore[entry])
                _fsync_dir(self.folder)
                logger.warning(
                    "Restored checkpoint %s (a crashed replacement moved it)", restore[entry]
                )
            elif OLD_DIR.match(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                logger.warning("Removed replaced checkpoint %s (a crashed replacement)", entry)
        self._recovered = True

    def save(self, payload: CheckpointPayload) -> Path:
        """Write ``payload`` as its step's checkpoint atomically, then prune old ones; its path.

        Saving a step that already exists replaces it.

        Raises:
            RuntimeError: :meth:`recover` was not called first.
            ValueError: the metrics lack ``best_metric`` (nothing is written).
            TypeError: ``extra`` or ``metrics`` are not JSON-able (nothing is written).
        """
        if not self._recovered:
            raise RuntimeError(
                f"CheckpointWriter({str(self.folder)!r}).save: call recover() first (it creates "
                "the folder and undoes what a crashed save left there)"
            )
        step = payload.step
        if self.best_metric is not None and self.best_metric not in payload.metrics:
            raise ValueError(
                f"best_metric {self.best_metric!r} is missing from the metrics of the payload "
                f"of step {step}: got {sorted(payload.metrics)}"
            )
        trainer_json = payload.trainer_state_json()
        target = self.folder / step_dir_name(step)
        staging = self.folder / f".{target.name}.tmp-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            self._write_model(staging, payload)
            self._write_training_state(staging / TRAINING_STATE_FILE, payload)
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
        latest = latest_checkpoint(self.folder)
        if latest != target:
            logger.warning("Saved step %d below newer checkpoints; the latest is %s", step, latest)
        self._prune(keep=target)
        return target

    def _write_model(self, staging: Path, payload: CheckpointPayload) -> None:
        model, model_dir = payload.model, staging / MODEL_DIR
        if payload.model_state is not None:
            model.save_pretrained(model_dir, state_dict=payload.model_state)
        elif is_peft_model(model):
            # Merged weights computed layer by layer: the caller keeps training the adapter.
            base = model.get_base_model()
            base.save_pretrained(model_dir, state_dict=merged_state_dict(model))
            model.save_pretrained(staging / ADAPTER_DIR)
        else:
            model.save_pretrained(model_dir)
        if payload.tokenizer is not None:
            payload.tokenizer.save_pretrained(model_dir)

    def _write_training_state(self, path: Path, payload: CheckpointPayload) -> None:
        optimizer, scheduler = payload.optimizer, payload.scheduler
        state = {
            "optimizer": optimizer.state_dict()
            if optimizer is not None
            else payload.optimizer_state,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": payload.rng,
        }
        if payload.master_weights is not None:
            state["master_weights"] = {
                name: tensor.detach().cpu() for name, tensor in payload.master_weights.items()
            }
        torch.save(state, path)

    def _publish(self, staging: Path, target: Path) -> None:
        """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first."""
        if not target.exists():
            os.rename(staging, target)
            _fsync_dir(self.folder)
            return
        aside = self.folder / f".{target.name}.old-{secrets.token_hex(4)}"
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except OSError:
            os.rename(aside, target)
            raise
        _fsync_dir(self.folder)
        logger.info("Replaced existing checkpoint %s", target)
        shutil.rmtree(aside, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        """Delete complete checkpoints beyond the newest ``keep_last``, the best and ``keep``."""
        complete = list_checkpoints(self.folder)
        kept = {*complete[-self.keep_last :], keep}
        if self.best_metric is not None:
            best = best_checkpoint(self.folder, self.best_metric, self.best_mode)
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
        doomed = self.folder / f".{path.name}.tmp-delete-{secrets.token_hex(4)}"
        os.rename(path, doomed)
        _fsync_dir(self.folder)
        shutil.rmtree(doomed)


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
