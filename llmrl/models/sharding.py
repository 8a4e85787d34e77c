"""Whether a model is sharded by FSDP2 (its parameters split across trainer ranks)."""

from __future__ import annotations

from typing import Any


def is_fully_sharded(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (``fully_shard``).

    Such a model gathers its parameters for each forward and frees them after it, so code that
    calls it twice before one backward (a shared-prompt pass) must call it once instead.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(model, FSDPModule)
