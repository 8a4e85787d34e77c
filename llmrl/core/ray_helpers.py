"""Ray and networking helpers every role uses: ``ray`` imported with a clear error when the
extra is missing, and a free TCP port for a process group's rendezvous."""

from __future__ import annotations

import socket
from typing import Any

from llmrl.core.errors import MissingExtraError


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
