"""Join the Ray cluster the stage runs in, or start a local one for it.

Inside a KubeRay RayJob, ``RAY_ADDRESS`` points at the job's cluster and the stage joins it;
on a laptop (``make run``) a local Ray is started for the stage and shut down after it (its
worker processes at the stage's priority, not Ray's nice 15). Actors
get the driver's ``LLMRL_*``, Hugging Face and tokenizer environment variables (model cache,
offline mode, fault injection), so they load what the driver would.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

FORWARDED_PREFIXES: tuple[str, ...] = ("LLMRL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
"""Environment variables the driver hands to every actor."""

WORKER_NICENESS_ENV = "RAY_worker_niceness"
"""Ray's setting of its worker processes' nice value (Ray's default: 15). A local Ray started for
the stage runs its actors at 0, the stage process's own priority: at 15 any other busy program
on the machine gets nearly all of a core it shares with an actor (scheduler weights 1024
against 36), and a 2-thread engine or trainer rank, whose threads meet at every parallel
region, then runs at the pace of its starved thread."""


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """``ray`` connected to ``address`` (or ``$RAY_ADDRESS``), or to a local Ray started here
    (and shut down on exit). An already connected Ray is used as it is."""
    from llmrl.core.ray_helpers import import_ray

    ray = import_ray("The GRPO runtime")
    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=True)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token for a private local Ray
        os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="llmrl-ray-"))
        # Ray starts its worker processes at nice 15; here they are the stage's compute
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
        logger.info("starting a local Ray for the stage")
        ray.init(include_dashboard=False, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()


def actor_runtime_env() -> dict[str, Any]:
    """The runtime environment of every actor: the forwarded environment variables."""
    env_vars = {
        name: value for name, value in os.environ.items() if name.startswith(FORWARDED_PREFIXES)
    }
    return {"env_vars": env_vars}
