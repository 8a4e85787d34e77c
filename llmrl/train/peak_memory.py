"""The peak memory of one training step: CUDA's peak allocated bytes on a GPU, the process's
peak resident set size (``VmHWM``) on a CPU.

Both are reset at the start of a step (:func:`reset_peak_memory`), so each step reports its own
peak: ``torch.cuda.reset_peak_memory_stats`` on CUDA; on Linux, writing ``5`` to
``/proc/self/clear_refs`` resets ``VmHWM`` to the current RSS (``proc(5)``). Where that file
cannot be written the CPU figure is the process's peak so far.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
MIB = 1024 * 1024


def reset_peak_memory(device: torch.device | str) -> None:
    """Start measuring a new peak on ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    # not Linux, or not allowed: the figure stays the peak so far
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text("5")


def peak_memory_mb(device: torch.device | str) -> float:
    """MiB: CUDA's peak allocated memory on ``device``, or the process's peak RSS on a CPU,
    since the last :func:`reset_peak_memory`."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB
    with contextlib.suppress(OSError):  # no /proc (not Linux): getrusage's peak so far
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):  # "VmHWM:	  17028 kB"
                return int(line.split()[1]) * 1024 / MIB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return peak / MIB if sys.platform == "darwin" else peak * 1024 / MIB
