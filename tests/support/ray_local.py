"""A local Ray for tests (the ``local_ray`` fixture in ``tests/conftest.py`` starts one per
module), and the runtime environment its actors need."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO


@contextlib.contextmanager
def started_local_ray() -> Iterator[Any]:
    """A local Ray with 2 CPUs, no dashboard and no auth token (the test is skipped without
    Ray), shut down on exit; its temporary folder is removed unless ``RAY_TMPDIR`` names one."""
    ray = pytest.importorskip("ray")
    own_tmp = None if os.environ.get("RAY_TMPDIR") else tempfile.mkdtemp(prefix="ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        if own_tmp is not None:
            patch.setenv("RAY_TMPDIR", own_tmp)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
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
        "PYTHONPATH": str(REPO),
    }
    return {"env_vars": env_vars}
