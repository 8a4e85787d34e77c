"""A checkpoint folder as readers see it: the file names, which checkpoints are complete, the
newest and the best, and a checkpoint's recorded state. Nothing here creates, renames or
deletes anything (the writer, :class:`~llmrl.train.checkpoint_writer.CheckpointWriter`, does).

The format is described in :mod:`llmrl.train.checkpoint`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

COMPLETE_MARKER = "COMPLETE"
MODEL_DIR = "model"
ADAPTER_DIR = "adapter"
TRAINING_STATE_FILE = "training_state.pt"
TRAINER_STATE_FILE = "trainer_state.json"
FORMAT_VERSION = 1

STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_DIR = re.compile(r"^\.step-\d+\.tmp-")
"""A save in progress (or crashed), or a pruned checkpoint being deleted."""
OLD_DIR = re.compile(r"^\.(step-(\d+))\.old-")
"""A checkpoint moved aside while a save of the same step replaces it."""


@dataclass
class TrainState:
    """What a training loop needs to continue from a checkpoint: ``step`` is the number of
    steps done when it was saved, so the loop continues with ``range(step, steps)``."""

    step: int
    extra: dict = field(default_factory=dict)
    """Loop-specific JSON-able state (collector / primer counters, best metric so far, ...)."""
    metrics: dict = field(default_factory=dict)
    """Metrics recorded at that step."""


def step_dir_name(step: int) -> str:
    """The folder name of ``step``'s checkpoint: ``step-000120``."""
    return f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory whose save finished (it has the marker)."""
    return path.is_dir() and (path / COMPLETE_MARKER).is_file()


def moved_aside(folder: str | Path) -> dict[Path, Path]:
    """Complete checkpoints a crashed replacement left moved aside, each by the path it had (and
    gets back from the writer's ``recover()``): ``{folder/step-N: folder/.step-N.old-…}``.
    Only steps whose own directory is missing count; the first such copy by name wins."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    found: dict[Path, Path] = {}
    for entry in sorted(folder.iterdir()):
        old = OLD_DIR.match(entry.name)
        if old is None:
            continue
        target = folder / old.group(1)
        if target not in found and not target.exists() and is_complete(entry):
            found[target] = entry
    return found


def list_checkpoints(folder: str | Path) -> list[Path]:
    """The complete checkpoints in ``folder``, oldest step first (none when it is missing).

    A complete checkpoint that a crashed replacement left moved aside is listed at its
    temporary path (``.step-N.old-…``) until the writer's ``recover()`` puts it back.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and is_complete(entry):
            found.append((int(match.group(1)), entry))
    for aside in moved_aside(folder).values():
        found.append((int(OLD_DIR.match(aside.name).group(2)), aside))
    return [path for _, path in sorted(found)]


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or ``None`` when there is none."""
    complete = list_checkpoints(folder)
    return complete[-1] if complete else None


def best_checkpoint(folder: str | Path, metric: str, mode: str = "max") -> Path | None:
    """The complete checkpoint with the best recorded ``metric`` (``mode``: ``"max"`` or
    ``"min"``; on a tie the newer one wins); ``None`` when no checkpoint recorded it."""
    chosen, chosen_value = None, math.nan
    for path in list_checkpoints(folder):  # oldest first: on a tie the newer one wins
        value = read_train_state(path).metrics.get(metric)
        if not isinstance(value, (int, float)) or math.isnan(value):
            continue
        better = value >= chosen_value if mode == "max" else value <= chosen_value
        if chosen is None or better:
            chosen, chosen_value = path, value
    return chosen


def read_train_state(path: str | Path) -> TrainState:
    """A complete checkpoint's ``trainer_state.json`` (step, extra state, metrics).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` has no ``COMPLETE`` marker (its save did not finish).
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
    return TrainState(step=info["step"], extra=info["extra"], metrics=info["metrics"])


def read_training_state(path: str | Path) -> dict:
    """A checkpoint's ``training_state.pt``: optimizer, scheduler and RNG states (and the
    master weights of a mixed-precision trainer)."""
    return torch.load(Path(path) / TRAINING_STATE_FILE, map_location="cpu", weights_only=True)
