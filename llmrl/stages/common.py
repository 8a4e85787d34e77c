"""What every training stage sets up the same way: the device check, its MLflow tracker, its
checkpoints and its progress bar."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from llmrl.config.common import CheckpointConfig, StageConfig
from llmrl.core.atomic_files import write_text_atomic
from llmrl.core.config_loading import ConfigError
from llmrl.train.checkpoint import CheckpointWriter, TrainState, resume_latest

logger = logging.getLogger(__name__)


def require_device(device: str) -> None:
    """Fail early, as a config problem, when ``model.device`` cannot hold tensors here.

    Raises:
        ConfigError: an unknown device type (``tpu``), or one this machine lacks (``cuda:7``).
    """
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:  # torch raises AssertionError without CUDA
        raise ConfigError(
            [f"model.device: {device!r} cannot be used on this machine ({error})"]
        ) from None


RUN_ID_FILE = "mlflow_run.json"
"""In a checkpoint directory: the MLflow run of the stage writing it, recorded as soon as the run
exists, so a process killed before its first checkpoint is continued in the same run."""


@contextmanager
def stage_tracker(
    stage: str,
    config: StageConfig,
    run_id: str | None = None,
    checkpoint_dir: str | Path | None = None,
) -> Iterator[Any]:
    """An MLflow :class:`~llmrl.tracking.Tracker` for ``stage``, started with the whole
    resolved config as params; FAILED on exception, FINISHED otherwise.

    ``run_id`` continues an existing run (resume from a checkpoint). With ``checkpoint_dir``
    (and ``checkpoint.resume: auto``) and no ``run_id``, the run recorded in that directory by
    an earlier process of the stage is continued; the run's id is then recorded there
    (:data:`RUN_ID_FILE`, the stage's own file beside the checkpoints) before anything is
    logged.
    """
    from llmrl.tracking import Tracker

    settings = config.tracking
    record = Path(checkpoint_dir) / RUN_ID_FILE if checkpoint_dir is not None else None
    resume = getattr(getattr(config, "checkpoint", None), "resume", "never")
    if run_id is None and record is not None and resume == "auto":
        run_id = recorded_run_id(record)
    tracker = Tracker(
        stage,
        experiment=settings.experiment,
        tracking_uri=settings.tracking_uri,
        run_name=settings.run_name or stage,
        parent_run_id=settings.parent_run_id,
        run_id=run_id,
        enabled=settings.enabled,
        log_checkpoint_files=settings.log_checkpoint_files,
    )
    with tracker:
        if record is not None and tracker.run_id is not None:
            record_run_id(record, tracker.run_id)
        tracker.log_params(config.model_dump(mode="json"))
        yield tracker


SPLIT_CONTEXTS = {"train": "training", "eval": "evaluation"}
"""What a stage uses a prepared split for: the MLflow dataset context of its run input."""


def log_prepared_data(
    tracker: Any,
    path: str | Path,
    manifest: dict[str, Any],
    splits: tuple[str, ...] = ("train", "eval"),
) -> None:
    """Log the prepared dataset's ``splits`` the stage read as its run's inputs (contexts:
    :data:`SPLIT_CONTEXTS`)."""
    from llmrl.data.prepared_folder import SPLIT_FILES
    from llmrl.tracking import prepared_inputs

    files = {SPLIT_FILES[split]: SPLIT_CONTEXTS[split] for split in splits}
    tracker.log_inputs(prepared_inputs(path, manifest, files))


def register_final_model(
    tracker: Any, stage: str, config: StageConfig, checkpoint: Path | None
) -> str | None:
    """Log the final checkpoint's ``model/`` directory as the run's model and register it as a
    version of ``<experiment>-<stage>`` (:mod:`llmrl.tracking.models`); ``"<name>/<version>"``
    or None (no checkpoint, tracking off or unreachable)."""
    if checkpoint is None:
        return None
    from llmrl.tracking import registered_name

    name = registered_name(config.tracking.experiment, stage)
    return tracker.log_model(Path(checkpoint) / "model", name)


def recorded_run_id(path: Path) -> str | None:
    """The run id :func:`record_run_id` wrote to ``path``, or None (no file, unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))["run_id"] or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_run_id(path: Path, run_id: str) -> None:
    """Write ``{"run_id": ...}`` to ``path`` atomically (unchanged content is not rewritten),
    creating its directory when missing."""
    if recorded_run_id(path) == run_id:
        return
    write_text_atomic(path, json.dumps({"run_id": run_id}))


def open_checkpoints(
    settings: CheckpointConfig,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[CheckpointWriter, TrainState | None]:
    """A one-process stage's checkpoint writer (recovered: the folder exists and what a crashed
    save left there is undone), and the state it resumed from (``resume: auto`` and a complete
    checkpoint present), or None for a fresh start."""
    writer = CheckpointWriter.from_config(settings)
    writer.recover()
    auto = settings.resume == "auto"
    state = resume_latest(settings.dir, model, optimizer, scheduler) if auto else None
    return writer, state


def step_bar(stage: str, start: int, steps: int, enabled: bool) -> tqdm:
    """The stage's progress bar over steps ``start..steps`` (resumed runs start part-way); with
    the bar off (a pipeline's stage subprocess, whose output goes to the flow's log), each step's
    ``set_postfix`` becomes a log line instead: ``grpo step 3/24: reward 0.512, loss 0.0031``."""
    return StepBar(stage, start, steps, enabled)


class StepBar(tqdm):
    """A tqdm over steps that logs one line per step when it is not drawn (see :func:`step_bar`)."""

    def __init__(self, stage: str, start: int, steps: int, enabled: bool) -> None:
        super().__init__(
            range(start, steps), desc=stage, disable=not enabled, initial=start, total=steps
        )
        self.stage, self.steps, self.logged_step, self.logging = stage, steps, start, not enabled

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """Show the step's figures on the bar, or log them when the bar is off."""
        if not self.logging:
            super().set_postfix(ordered_dict, refresh, **kwargs)
            return
        self.logged_step += 1
        figures = {**(ordered_dict or {}), **kwargs}
        shown = ", ".join(f"{name} {value}" for name, value in figures.items())
        logger.info("%s step %d/%d: %s", self.stage, self.logged_step, self.steps, shown)
