"""The local Ray a stage starts runs its actors at the stage's priority (Ray's default: nice 15)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from llmrl.runtime.ray_cluster import WORKER_NICENESS_ENV, ray_session
from tests.support.paths import REPO


def _niceness() -> int:
    return os.nice(0)


def test_local_ray_runs_actors_at_the_stage_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process: ray_session would join it")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(WORKER_NICENESS_ENV, raising=False)
    ray_tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    options = {"num_cpus": 0.5, "runtime_env": {"env_vars": {"PYTHONPATH": str(REPO)}}}
    with ray_session(None) as session:
        actor = session.remote(_Probe).options(**options).remote()
        assert session.get(actor.niceness.remote()) == _niceness()
        task = session.remote(_niceness).options(**options)
        assert session.get(task.remote()) == _niceness()
    assert not ray.is_initialized()
    shutil.rmtree(ray_tmp, ignore_errors=True)


class _Probe:
    def niceness(self) -> int:
        return _niceness()
