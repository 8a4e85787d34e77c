"""`prefect deploy` of prefect.yaml against a real local Prefect server.

One `prefect server start` per module (PREFECT_HOME in a temp folder), then, through the CLI as an
operator would run it from the repository root:

* the Kubernetes work pool from k8s/prefect-work-pool-job-template.json (type `kubernetes` needs
  no prefect-kubernetes: the CLI accepts the types listed in Prefect's bundled worker metadata,
  which the server serves when the collection registry cannot be reached);
* `prefect deploy --name default`, which must exit 0 (with FastAPI >= 0.151 it registers the
  deployment, then exits 1 on a 422 from `POST /api/work_pools/<pool>/workers/filter`);
* the deployment read back over the REST API: parameters, job variables, tags, concurrency limit.

Then a copy of the same deployment on a local `process` work pool runs one flow run through
`prefect worker start --run-once`: every stage skipped, so no model runs, but the flow opens and
closes its MLflow parent run (SQLite in the temp folder) under the deployment's concurrency limit.
No Kubernetes cluster is involved: the flow-run pod itself is not started here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB_TEMPLATE = REPO / "k8s" / "prefect-work-pool-job-template.json"
IMAGE = "registry.example/llmrl:9.9.9"
STARTUP_S = 90.0


@dataclass(frozen=True)
class PrefectServer:
    """A running `prefect server start` and the environment its clients use."""

    api: str
    env: dict[str, str]
    home: Path

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """`prefect <args>` from the repository root, without prompts."""
        return subprocess.run(
            [sys.executable, "-m", "prefect", "--no-prompt", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.api}{path}", timeout=10) as response:
            return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    root = tmp_path_factory.mktemp("prefect-deploy")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(root / "prefect"),
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        HOME=str(root / "home"),  # MLflow and others write under ~
        MLFLOW_DISABLE_TELEMETRY="true",
        LLMRL_IMAGE=IMAGE,
    )
    env.pop("LLMRL_FLOW_IMAGE", None)
    (root / "home").mkdir()
    log = (root / "server.log").open("w")
    command = ["server", "start", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect", *command],
        env={k: v for k, v in env.items() if k != "PREFECT_API_URL"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _healthy(api):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prefect server did not start:\n{(root / 'server.log').read_text()}")
            time.sleep(0.5)
        yield PrefectServer(api=api, env=env, home=root)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def kubernetes_deployment(server: PrefectServer) -> dict[str, Any]:
    """The work pool created from the repo's job template, then `prefect deploy --name default`."""
    _ok(
        server.cli(
            "work-pool", "create", "llmrl-k8s", "--type", "kubernetes",
            "--base-job-template", str(JOB_TEMPLATE),
        )
    )  # fmt: skip
    _ok(server.cli("deploy", "--name", "default"))
    return server.get("/deployments/name/llmrl-pipeline/default")


def _prefect_yaml() -> dict[str, Any]:
    return yaml.safe_load((REPO / "prefect.yaml").read_text())


def test_work_pool_is_kubernetes_with_the_repo_template(server, kubernetes_deployment):
    pool = server.get("/work_pools/llmrl-k8s")
    assert pool["type"] == "kubernetes"
    assert pool["base_job_template"] == json.loads(JOB_TEMPLATE.read_text())


def test_deploy_registers_the_default_deployment(kubernetes_deployment):
    deployment = kubernetes_deployment
    declared = next(d for d in _prefect_yaml()["deployments"] if d["name"] == "default")
    assert deployment["entrypoint"] == "flows/pipeline.py:pipeline"
    assert deployment["work_pool_name"] == "llmrl-k8s"
    assert deployment["pull_steps"] == [
        {
            "prefect.deployments.steps.set_working_directory": {
                "directory": "/opt/llmrl/src",
            }
        }
    ]
    assert set(deployment["tags"]) == set(declared["tags"]) >= {"llmrl", "sft", "grpo"}


def test_deployment_images_come_from_llmrl_image(kubernetes_deployment):
    params = kubernetes_deployment["parameters"]["params"]
    assert params["launcher"] == "kubernetes"
    assert params["kubernetes"]["image"] == IMAGE  # the stages: the gpu image
    variables = kubernetes_deployment["job_variables"]
    assert variables["image"] == f"{IMAGE}-flow"  # the flow-run pod: the torch-free flow image
    assert variables["namespace"] == params["kubernetes"]["namespace"] == "llmrl"
    assert variables["shared_claim"] == params["kubernetes"]["shared_claim"]
    assert "gpu" not in json.dumps(variables).lower()


def test_job_variables_are_variables_of_the_pool_template(kubernetes_deployment):
    template = json.loads(JOB_TEMPLATE.read_text())
    declared = set(template["variables"]["properties"])
    assert set(kubernetes_deployment["job_variables"]) <= declared


def test_one_pipeline_run_at_a_time(kubernetes_deployment):
    deployment = kubernetes_deployment
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "ENQUEUE"


def test_a_deployed_run_completes_on_a_process_worker(server, kubernetes_deployment, tmp_path):
    """The same deployment on a local process pool, with the code at the repository root."""
    _ok(server.cli("work-pool", "create", "llmrl-local", "--type", "process"))
    config = _prefect_yaml()
    pull = {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
    config["pull"] = [pull]
    declared = next(d for d in config["deployments"] if d["name"] == "default")
    local = {
        **declared,
        "name": "local-process",
        "work_pool": {"name": "llmrl-local", "job_variables": {}},
        "parameters": {
            "params": {
                "launcher": "local",
                "work_dir": str(tmp_path / "work"),
                "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "experiment": "deploy-test",
                "skip": ["prepare", "sft", "grpo", "eval"],
            }
        },
    }
    config["deployments"] = [local]
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(config, sort_keys=False))
    _ok(server.cli("deploy", "--prefect-file", str(prefect_file), "--name", "local-process"))

    run = _ok(server.cli("deployment", "run", "llmrl-pipeline/local-process"))
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", run).group(1)
    _ok(
        server.cli(
            "worker", "start", "--pool", "llmrl-local", "--type", "process", "--run-once",
            timeout=240,
        )
    )  # fmt: skip
    state = server.get(f"/flow_runs/{flow_run_id}")["state"]
    assert state["type"] == "COMPLETED", state
    assert (tmp_path / "mlflow.db").is_file()  # the flow's MLflow parent run
