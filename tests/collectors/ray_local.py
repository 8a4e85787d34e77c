"""A local Ray for collector tests, and the environment its actors need.

Shared by ``tests/collectors`` and ``tests/reliability``: import ``local_ray`` into a test module
to use it (``from tests.collectors.ray_local import local_ray  # noqa: F401``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray(session_cache: Path) -> Iterator[Any]:
    """A local Ray with 2 CPUs, no dashboard and no auth token, shut down after the module."""
    ray = pytest.importorskip("ray")
    own_tmp = None if os.environ.get("RAY_TMPDIR") else tempfile.mkdtemp(prefix="ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        if own_tmp is not None:
            patch.setenv("RAY_TMPDIR", own_tmp)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
        ray.shutdown()
    if own_tmp is not None:
        shutil.rmtree(own_tmp, ignore_errors=True)


def actor_runtime_env(session_cache: Path) -> dict[str, Any]:
    """The runtime env of test actors: this session's tokenizer cache, offline Hugging Face, and
    the repository on ``PYTHONPATH`` (the factories live in the tests package)."""
    env_vars = {
        "LLMRL_CACHE": str(session_cache),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return {"env_vars": env_vars}
