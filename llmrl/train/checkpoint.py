"""Crash-safe training checkpoints: one writer per folder, side-effect-free readers.

A checkpoint is a directory ``<folder>/step-000120/`` holding:

* ``model/`` -- the model's ``save_pretrained`` output (safetensors) plus the tokenizer's, so
  ``load_model("<folder>/step-000120/model")`` works directly. For a ``peft.PeftModel`` this
  is the *merged* full model (merged weight by weight, :func:`llmrl.train.lora.merged_state_dict`:
  the model is neither copied nor modified), and ``adapter/`` holds the adapter's own
  ``save_pretrained``.
* ``training_state.pt`` -- optimizer and scheduler state dicts and the torch / CUDA / python
  ``random`` / numpy RNG states (``torch.save``; loadable with ``weights_only=True``); under
  mixed precision also the float32 master weights (``model/`` holds them cast to
  ``model.dtype``), which :func:`load_checkpoint` puts back so a resume is exact.
* ``trainer_state.json`` -- step, loop-specific ``extra`` state, metrics, time, llmrl version.
* ``COMPLETE`` -- written last; a directory without it is never resumed from.

Writing (:class:`CheckpointWriter`, one per folder: rank 0 of the GRPO trainer, the SFT
stage's process; :class:`CheckpointPayload` is what one save holds): every checkpoint is
written as ``.step-000120.tmp-<random>`` in the same folder, fsynced, and renamed into place,
so a crash at any moment leaves either the previous checkpoints untouched or the new one
complete. Replacing an existing step moves the old directory aside (``.step-000120.old-<random>``)
before renaming the new one in; :meth:`CheckpointWriter.recover`, called by the writer's owner
before its first save, puts it back after a crash between those two renames and deletes the
temporary directories of crashed saves. Pruned checkpoints are renamed to a temporary name
before deletion, so a half-deleted directory never looks complete.

Reading (:func:`list_checkpoints`, :func:`latest_checkpoint`, :func:`best_checkpoint`,
:func:`read_train_state`, :func:`load_checkpoint`, :func:`resume_latest`) creates, renames and
deletes nothing, so any process may read a folder another one writes. A checkpoint left moved
aside by a crashed replacement is read where it lies until the writer's ``recover()``.

A checkpoint's ``step`` is the number of steps done when it was saved, so a resumed loop
continues with ``range(state.step, steps)``, as the stages do::

    >>> import tempfile, torch
    >>> from llmrl.models import tiny_model
    >>> folder = tempfile.TemporaryDirectory()
    >>> model = tiny_model(seed=0)
    >>> optimizer = torch.optim.AdamW(model.parameters())
    >>> writer = CheckpointWriter(folder.name, keep_last=2)
    >>> writer.recover()
    >>> for done in (1, 2, 3):  # after each training step
    ...     path = writer.save(CheckpointPayload(step=done, model=model, optimizer=optimizer))
    >>> [path.name for path in list_checkpoints(folder.name)]
    ['step-000002', 'step-000003']
    >>> state = resume_latest(folder.name, model, optimizer)  # None on a fresh start
    >>> start = state.step if state is not None else 0
    >>> list(range(start, 5))  # the steps a run of 5 still has to do
    [3, 4]
    >>> folder.cleanup()
"""

from __future__ import annotations

from llmrl.train.checkpoint_layout import (
    ADAPTER_DIR,
    COMPLETE_MARKER,
    FORMAT_VERSION,
    MODEL_DIR,
    TRAINER_STATE_FILE,
    TRAINING_STATE_FILE,
    TrainState,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    read_train_state,
    read_training_state,
)
from llmrl.train.checkpoint_load import load_checkpoint, resume_latest
from llmrl.train.checkpoint_writer import CheckpointPayload, CheckpointWriter

__all__ = [
    "ADAPTER_DIR",
    "COMPLETE_MARKER",
    "FORMAT_VERSION",
    "MODEL_DIR",
    "TRAINER_STATE_FILE",
    "TRAINING_STATE_FILE",
    "CheckpointPayload",
    "CheckpointWriter",
    "TrainState",
    "best_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_train_state",
    "read_training_state",
    "resume_latest",
]
