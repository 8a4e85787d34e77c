"""Join the Ray cluster the stage runs in, or start a local one for it.

Inside a KubeRay RayJob, ``RAY_ADDRESS`` points at the job's cluster and the stage joins it;
on a laptop (``make run``) a local Ray is started for the stage and shut down after it (its
worker processes at the stage's priority, not Ray's nice 15). Actors
get the driver's ``LLMRL_*``, Hugging Face and tokenizer environment variables (model cache,
offline mode, fault injection), so they load what the driver would.

The user's own code (their task, their reward functions) reaches the actors through Ray's
``runtime_env`` of the job: a RayJob's ``runtimeEnvYAML``; where the stage starts or joins a
Ray itself, the runtime_env ``$LLMRL_RAY_RUNTIME_ENV`` names (the local launcher sets it from
the pipeline's ``runtime_env`` parameter). The actors' own runtime_env (:func:`actor_runtime_env`,
``env_vars`` only) is merged into the job's by Ray, so ``py_modules`` ship to every actor.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llmrl.core.ray_helpers import RUNTIME_ENV_VARIABLE

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
    job_env = job_runtime_env()
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=True, **job_env)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token for a private local Ray
        os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="llmrl-ray-"))
        # Ray starts its worker processes at nice 15; here they are the stage's compute
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
        logger.info("starting a local Ray for the stage")
        ray.init(include_dashboard=False, log_to_driver=True, **job_env)
    try:
        yield ray
    finally:
        ray.shutdown()


def job_runtime_env() -> dict[str, Any]:
    """``{"runtime_env": ...}`` for ``ray.init`` from ``$LLMRL_RAY_RUNTIME_ENV`` (empty when
    unset).

    Raises:
        ValueError: the variable is not a JSON object.
    """
    text = os.environ.get(RUNTIME_ENV_VARIABLE, "").strip()
    if not text:
        return {}
    try:
        runtime_env = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"${RUNTIME_ENV_VARIABLE} is not JSON: {error}") from None
    if not isinstance(runtime_env, dict):
        raise ValueError(f"${RUNTIME_ENV_VARIABLE} must be a JSON object, got {text[:80]!r}")
    if runtime_env:
        logger.info("Ray runtime_env of the stage's job: %s", sorted(runtime_env))
    return {"runtime_env": runtime_env} if runtime_env else {}


def actor_runtime_env() -> dict[str, Any]:
    """The runtime environment of every actor: the forwarded environment variables."""
    env_vars = {
        name: value for name, value in os.environ.items() if name.startswith(FORWARDED_PREFIXES)
    }
    return {"env_vars": env_vars}
