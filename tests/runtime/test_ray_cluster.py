"""The local Ray a stage starts (``ray_session``): its actors run at the stage's priority (Ray's
default: nice 15), and the pipeline's runtime_env (``$LLMRL_RAY_RUNTIME_ENV``, set by the local
launcher) ships the user's package to actors that never had it installed. One Ray start serves
the module."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmrl.core.ray_helpers import RUNTIME_ENV_VARIABLE
from llmrl.runtime.ray_cluster import (
    WORKER_NICENESS_ENV,
    actor_runtime_env,
    job_runtime_env,
    ray_session,
)
from tests.support.paths import REPO

USER_REWARDS = """
def score(response, answer, **fields):
    return 1.0 if response.strip() == answer else 0.0
"""
"""The user's reward function, in a package only the runtime_env knows about."""


@pytest.fixture(scope="module")
def user_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``userpkg`` (``userpkg.rewards:score``), in a folder on no one's ``sys.path``."""
    package = tmp_path_factory.mktemp("user-code") / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "rewards.py").write_text(USER_REWARDS, encoding="utf-8")
    assert importlib.util.find_spec("userpkg") is None  # not importable here
    return package


@pytest.fixture(scope="module")
def stage_ray(user_package: Path) -> Iterator[Any]:
    """The Ray a GRPO stage run by the local launcher starts: ``ray_session`` with the
    runtime_env the launcher hands it."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process: ray_session would join it")
    ray_tmp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 bytes
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.delenv(WORKER_NICENESS_ENV, raising=False)
        patch.setenv("RAY_TMPDIR", ray_tmp)
        patch.setenv("RAY_AUTH_MODE", "disabled")
        patch.setenv(RUNTIME_ENV_VARIABLE, json.dumps({"py_modules": [str(user_package)]}))
        with ray_session(None) as session:
            yield session
        assert not ray.is_initialized()
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _actor_options() -> dict[str, Any]:
    """What the GRPO runtime gives each actor (the forwarded env), plus the repository on
    ``PYTHONPATH`` for the test's own classes."""
    env = actor_runtime_env()
    env["env_vars"]["PYTHONPATH"] = str(REPO)
    return {"num_cpus": 0.5, "runtime_env": env}


@pytest.fixture(scope="module")
def probe(stage_ray: Any) -> Any:
    """One actor, started as the GRPO runtime starts its env workers, for the module."""
    return stage_ray.remote(_Probe).options(**_actor_options()).remote()


def _niceness() -> int:
    return os.nice(0)


def test_local_ray_runs_actors_at_the_stage_priority(stage_ray: Any, probe: Any) -> None:
    assert stage_ray.get(probe.niceness.remote()) == _niceness()
    task = stage_ray.remote(_niceness).options(**_actor_options())
    assert stage_ray.get(task.remote()) == _niceness()


def test_py_modules_bring_the_users_task_to_actors_that_never_had_it(
    stage_ray: Any, probe: Any, user_package: Path
) -> None:
    """An env-worker-like actor builds the user's task from its import path and scores with it;
    the package comes from Ray's copy of ``py_modules``, not from the folder it was written to
    (which is on no ``sys.path``)."""
    seen = stage_ray.get(
        probe.score_with.remote("userpkg.rewards:score", [("42", "42"), (" 7\n", "7"), ("6", "7")])
    )
    assert seen["rewards"] == [1.0, 1.0, 0.0]
    assert not seen["module"].startswith(str(user_package.parent))
    assert "runtime_resources" in seen["module"]  # Ray's py_modules copy on this node
    assert str(user_package.parent) not in seen["sys_path"]


def test_a_bad_runtime_env_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_ENV_VARIABLE, "[1]")
    with pytest.raises(ValueError, match=f"{RUNTIME_ENV_VARIABLE} must be a JSON object"):
        job_runtime_env()
    monkeypatch.setenv(RUNTIME_ENV_VARIABLE, "{py_modules")
    with pytest.raises(ValueError, match="is not JSON"):
        job_runtime_env()
    monkeypatch.setenv(RUNTIME_ENV_VARIABLE, "")
    assert job_runtime_env() == {}


class _Probe:
    def niceness(self) -> int:
        return _niceness()

    def score_with(self, spec: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        from llmrl.envs.tasks import make_task

        task = make_task(spec)
        rewards = []
        for response, answer in pairs:
            score = task.score(response, answer)
            rewards.append(float(getattr(score, "reward", score)))
        module = sys.modules[spec.partition(":")[0]]
        return {"rewards": rewards, "module": str(module.__file__), "sys_path": list(sys.path)}
