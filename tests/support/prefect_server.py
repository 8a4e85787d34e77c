"""A real Prefect server for the deployment tests, and the operator's side of it: the ``prefect``
CLI from the repository root, the REST API, and a deployment of ``prefect.yaml``'s pipeline on a
local ``process`` work pool run once by ``prefect worker start --run-once``.

``tests/flows/test_prefect_deploy.py`` runs a plain ``prefect server start`` (SQLite under a
temporary ``PREFECT_HOME``, :func:`sqlite_server`); ``tests/services`` runs the chart's server
on PostgreSQL. Both drive it through :class:`PrefectCli`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO
from tests.support.service_process import ServiceProcess, free_port

JOB_TEMPLATE = REPO / "k8s" / "prefect-work-pool-job-template.json"
"""The Kubernetes work pool's base job template an operator creates the pool with."""


def client_env(api: str, root: Path, **extra: str) -> dict[str, str]:
    """The environment of an operator's shell against ``api``: no inherited ``PREFECT_*``
    setting, a ``PREFECT_HOME`` and ``HOME`` under ``root`` (MLflow and others write under ~)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    (root / "home").mkdir(parents=True, exist_ok=True)
    env.update(
        PREFECT_HOME=str(root / "prefect"),
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        HOME=str(root / "home"),
        MLFLOW_DISABLE_TELEMETRY="true",
        **extra,
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@dataclass(frozen=True)
class PrefectCli:
    """The ``prefect`` CLI and the REST API of one server, from the repository root."""

    api: str
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``prefect <args>`` from the repository root, without prompts."""
        return subprocess.run(
            [sys.executable, "-m", "prefect", "--no-prompt", *args],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def ok(self, *args: str, timeout: float = 120.0) -> str:
        """``prefect <args>``'s output; fails the test with both streams on a non-zero exit."""
        result = self.cli(*args, timeout=timeout)
        assert result.returncode == 0, (
            f"prefect {' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
        return result.stdout

    def get(self, path: str) -> Any:
        """GET ``<api><path>`` as JSON."""
        with urllib.request.urlopen(f"{self.api}{path}", timeout=10) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to ``<api><path>``; the JSON answer."""
        request = urllib.request.Request(
            f"{self.api}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def of_flow_run(self, what: str, flow_run_id: str) -> list[dict[str, Any]]:
        """``POST /<what>/filter`` (``artifacts``, ``logs``, ``task_runs``) of one flow run."""
        body = {what: {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "offset": 0}
        return self.post(f"/{what}/filter", body)


def sqlite_server(root: Path) -> ServiceProcess:
    """``prefect server start`` on 127.0.0.1 with its SQLite database under ``root`` (not
    started; the UI off). Its API is ``.url + "/api"``."""
    port = free_port()
    env = client_env(f"http://127.0.0.1:{port}/api", root, PREFECT_SERVER_UI_ENABLED="false")
    env.pop("PREFECT_API_URL")
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
            "--port", str(port)]  # fmt: skip
    return ServiceProcess(
        argv, env, port=port, health_url=f"http://127.0.0.1:{port}/api/health",
        log_path=root / "server.log", cwd=root, name="prefect server",
    )  # fmt: skip


def project() -> dict[str, Any]:
    """The repository's ``prefect.yaml``."""
    return yaml.safe_load((REPO / "prefect.yaml").read_text())


def process_deployment_file(folder: Path, name: str, pool: str, params: dict[str, Any]) -> Path:
    """A copy of ``prefect.yaml`` whose only deployment is the ``default`` one renamed ``name``,
    on the ``process`` work pool ``pool``, with the code at the repository root and ``params``
    as its pipeline parameters; written to ``folder/prefect.yaml``."""
    config = project()
    config["pull"] = [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    declared = next(d for d in config["deployments"] if d["name"] == "default")
    local = {
        **declared,
        "name": name,
        "work_pool": {"name": pool, "job_variables": {}},
        "parameters": {"params": params},
    }
    config["deployments"] = [local]
    path = folder / "prefect.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_once(prefect: PrefectCli, deployment: str, pool: str, timeout: float = 240.0) -> str:
    """``prefect deployment run <deployment>``, then one ``process`` worker on ``pool`` that runs
    it and exits; the flow run's id."""
    started = prefect.ok("deployment", "run", deployment)
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", started).group(1)
    prefect.ok("worker", "start", "--pool", pool, "--type", "process", "--run-once",
               timeout=timeout)  # fmt: skip
    return flow_run_id
