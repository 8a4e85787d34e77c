"""Ray and networking helpers every role uses: ``ray`` imported with a clear error when the
extra is missing, and a free TCP port for a process group's rendezvous."""

from __future__ import annotations

import socket
from typing import Any

from llmrl.core.errors import MissingExtraError

RUNTIME_ENV_VARIABLE = "LLMRL_RAY_RUNTIME_ENV"
"""Names a Ray ``runtime_env`` (JSON) for the Ray a stage starts or joins on its own: the local
launcher sets it from the pipeline's ``runtime_env`` parameter, so the user's ``py_modules``
reach the actors (:func:`llmrl.runtime.ray_cluster.ray_session`). A KubeRay RayJob carries
its runtime_env itself (``runtimeEnvYAML``) and does not set it."""


def free_port() -> int:
    """A TCP port free on this machine right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def import_ray(purpose: str) -> Any:
    """The ``ray`` module, or :class:`MissingExtraError` naming the ``local`` extra."""
    try:
        import ray
    except ImportError as error:
        raise MissingExtraError("ray", "local", purpose) from error
    return ray
