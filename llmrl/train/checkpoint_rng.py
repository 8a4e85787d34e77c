"""The random-number generator states a checkpoint keeps (torch, CUDA, Python's ``random``,
numpy's legacy generator), in a form ``torch.load(weights_only=True)`` reads back."""

from __future__ import annotations

import copy
import logging
import random
import sys
from typing import Any

import torch

logger = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states (numpy's only when numpy is already imported)."""
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


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` returned (CUDA's only on as many devices)."""
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
