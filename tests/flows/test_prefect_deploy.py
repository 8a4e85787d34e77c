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
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.prefect_server import (
    JOB_TEMPLATE,
    PrefectCli,
    client_env,
    process_deployment_file,
    project,
    run_once,
    sqlite_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IMAGE = "registry.example/llmrl:9.9.9"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectCli]:
    root = tmp_path_factory.mktemp("prefect-deploy")
    process = sqlite_server(root)
    process.start()
    try:
        env = client_env(process.url + "/api", root, LLMRL_IMAGE=IMAGE)
        env.pop("LLMRL_FLOW_IMAGE", None)
        yield PrefectCli(api=process.url + "/api", env=env)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def kubernetes_deployment(server: PrefectCli) -> dict[str, Any]:
    """The work pool created from the repo's job template, then `prefect deploy --name default`."""
    server.ok(
        "work-pool", "create", "llmrl-k8s", "--type", "kubernetes",
        "--base-job-template", str(JOB_TEMPLATE),
    )  # fmt: skip
    server.ok("deploy", "--name", "default")
    return server.get("/deployments/name/llmrl-pipeline/default")


def test_work_pool_is_kubernetes_with_the_repo_template(server, kubernetes_deployment):
    pool = server.get("/work_pools/llmrl-k8s")
    assert pool["type"] == "kubernetes"
    assert pool["base_job_template"] == json.loads(JOB_TEMPLATE.read_text())


def test_deploy_registers_the_default_deployment(kubernetes_deployment):
    deployment = kubernetes_deployment
    declared = next(d for d in project()["deployments"] if d["name"] == "default")
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
    server.ok("work-pool", "create", "llmrl-local", "--type", "process")
    params = {
        "launcher": "local",
        "work_dir": str(tmp_path / "work"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "experiment": "deploy-test",
        "skip": ["prepare", "sft", "grpo", "eval"],
    }
    prefect_file = process_deployment_file(tmp_path, "local-process", "llmrl-local", params)
    server.ok("deploy", "--prefect-file", str(prefect_file), "--name", "local-process")

    flow_run_id = run_once(server, "llmrl-pipeline/local-process", "llmrl-local")
    state = server.get(f"/flow_runs/{flow_run_id}")["state"]
    assert state["type"] == "COMPLETED", state
    assert (tmp_path / "mlflow.db").is_file()  # the flow's MLflow parent run
