"""The pipeline deployed on the chart's Prefect server and logging to the chart's MLflow server,
both on one real PostgreSQL (``tests/services/conftest.py`` starts them from the chart's render).

As an operator runs it, from the repository root: the Kubernetes work pool from the repo's job
template and ``prefect deploy --name default`` (the real ``prefect.yaml``); then the same
deployment on a local ``process`` pool with the short pipeline (tiny model, stages as local
subprocesses, as ``make run`` runs them), ``prefect deployment run`` and one
``prefect worker start --run-once``. One module-scoped flow run; the tests read back what it left
in Prefect (state, task runs, artifacts), in MLflow (nested runs, params, metrics by step,
datasets, registered models, served artifacts) and in PostgreSQL's own tables; compare it with
``python -m flows compare`` through both servers; then restart PostgreSQL and the Prefect server
and find everything again, and a second deployment run completes on the restarted database.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from flows.stages import RUN_ORDER
from tests.support.mlflow_runs import PNG_MAGIC, metric_steps
from tests.support.paths import REPO
from tests.support.pipeline_runs import (
    CHILD_RUNS,
    TRAINED,
    assert_dataset_inputs,
    assert_registered_models,
    child_runs,
    short_overrides,
)
from tests.support.postgres import PostgresCluster
from tests.support.prefect_server import (
    JOB_TEMPLATE,
    PrefectCli,
    client_env,
    process_deployment_file,
    run_once,
)
from tests.support.service_process import ServiceProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPERIMENT = "pg-pipeline"
POOL, DEPLOYMENT = "llmrl-local", "postgres-local"
FLOW_RUN_S = 480.0  # the short pipeline: about 2 minutes on 2 cores, with its stage processes


@pytest.fixture(scope="module")
def prefect(prefect_service: ServiceProcess, services_root: Path) -> PrefectCli:
    """The operator's ``prefect`` CLI and REST API against the chart's server."""
    api = prefect_service.url + "/api"
    return PrefectCli(api=api, env=client_env(api, services_root / "operator"))


@pytest.fixture(scope="module")
def kubernetes_deployment(prefect: PrefectCli) -> dict[str, Any]:
    """The Kubernetes work pool and ``prefect deploy --name default``, read back."""
    prefect.ok(
        "work-pool", "create", "llmrl-k8s", "--type", "kubernetes",
        "--base-job-template", str(JOB_TEMPLATE),
    )  # fmt: skip
    prefect.ok("deploy", "--name", "default")
    return prefect.get("/deployments/name/llmrl-pipeline/default")


@pytest.fixture(scope="module")
def work_dir(services_root: Path) -> Path:
    return services_root / "work"


@pytest.fixture(scope="module")
def flow_run(
    prefect: PrefectCli,
    kubernetes_deployment: dict[str, Any],
    mlflow_service: ServiceProcess,
    tiny_model_dir: Path,
    work_dir: Path,
    services_root: Path,
) -> dict[str, Any]:
    """The short pipeline deployed on a process pool and run once; the flow run, read back."""
    prefect.ok("work-pool", "create", POOL, "--type", "process")
    params = {
        "launcher": "local",
        "work_dir": str(work_dir),
        "mlflow_tracking_uri": mlflow_service.url,
        "experiment": EXPERIMENT,
        "overrides": short_overrides(tiny_model_dir),
        "retry_delay_s": 0,
    }
    prefect_file = process_deployment_file(services_root, DEPLOYMENT, POOL, params)
    prefect.ok("deploy", "--prefect-file", str(prefect_file), "--name", DEPLOYMENT)
    flow_run_id = run_once(prefect, f"llmrl-pipeline/{DEPLOYMENT}", POOL, timeout=FLOW_RUN_S)
    return prefect.get(f"/flow_runs/{flow_run_id}")


def _stage_summaries(work_dir: Path) -> dict[str, dict[str, Any]]:
    """The flow's finished-stage store: each stage's summary, by stage."""
    records = [json.loads(p.read_text()) for p in (work_dir / "stages").glob("*.json")]
    return {record["name"]: record["summary"] for record in records}


def _parent_run(client: MlflowClient, flow_run_id: str) -> Any:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (parent,) = client.search_runs(
        [experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'"
    )
    return parent


def test_deploy_stores_the_kubernetes_deployment_in_postgres(
    kubernetes_deployment: dict[str, Any], postgres: PostgresCluster
) -> None:
    assert kubernetes_deployment["entrypoint"] == "flows/pipeline.py:pipeline"
    assert kubernetes_deployment["work_pool_name"] == "llmrl-k8s"
    assert kubernetes_deployment["global_concurrency_limit"]["limit"] == 1
    pools = postgres.psql("SELECT name || ':' || type FROM work_pool ORDER BY name", "prefect")
    assert "llmrl-k8s:kubernetes" in pools.splitlines()
    deployments = postgres.psql("SELECT name FROM deployment", "prefect").splitlines()
    assert "default" in deployments


def test_the_flow_run_completes_with_its_artifacts(
    flow_run: dict[str, Any], prefect: PrefectCli
) -> None:
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
    task_runs = prefect.of_flow_run("task_runs", flow_run["id"])
    stages = {t["name"]: t["state"]["type"] for t in task_runs if t["name"] in RUN_ORDER}
    assert stages == dict.fromkeys(RUN_ORDER, "COMPLETED")
    by_key = {a["key"]: a for a in prefect.of_flow_run("artifacts", flow_run["id"])}
    markdown = by_key["llmrl-pipeline-summary"]["data"]
    assert "| sft | ran |" in markdown and "| grpo | ran |" in markdown
    rows = json.loads(by_key["llmrl-evaluation"]["data"])
    assert [row["model"] for row in rows] == ["base", "sft", "grpo"]
    assert float(by_key["llmrl-pipeline-progress"]["data"]) == 100.0
    logs = prefect.of_flow_run("logs", flow_run["id"])
    assert any("sft" in log["message"] for log in logs)


def test_every_stage_logged_to_mlflow_on_postgres(
    flow_run: dict[str, Any],
    mlflow_service: ServiceProcess,
    postgres: PostgresCluster,
    work_dir: Path,
    services_root: Path,
) -> None:
    client = MlflowClient(mlflow_service.url)
    parent = _parent_run(client, flow_run["id"])
    assert parent.info.status == "FINISHED"
    assert {"accuracy_base", "accuracy_sft", "accuracy_grpo"} <= set(parent.data.metrics)
    children = child_runs(client, EXPERIMENT, parent.info.run_id)
    assert set(children) == CHILD_RUNS
    assert {run.info.status for run in children.values()} == {"FINISHED"}
    for name, run in children.items():
        assert parent.data.tags[f"llmrl.run.{name}"] == run.info.run_id
    # metrics by step, and the resolved config as params (the overrides made it through)
    assert metric_steps(mlflow_service.url, children["sft"].info.run_id, "loss") == [1, 2]
    assert metric_steps(mlflow_service.url, children["grpo"].info.run_id, "reward_mean") == [1, 2]
    assert children["sft"].data.params["steps"] == "2"
    assert children["grpo"].data.params["num_samples"] == "2"

    summaries = _stage_summaries(work_dir)
    assert_dataset_inputs(client, children, Path(summaries["prepare"]["path"]))
    checkpoints = {name: Path(summaries[name]["final_checkpoint"]) for name in TRAINED}
    assert_registered_models(client, children, EXPERIMENT, checkpoints)

    # PostgreSQL holds them: one parent and its stage runs, one version per trained stage
    experiment_id = parent.info.experiment_id
    count = f"SELECT count(*) FROM runs WHERE experiment_id = {int(experiment_id)}"
    assert int(postgres.psql(count, "mlflow")) == 1 + len(CHILD_RUNS)
    versions = postgres.psql(
        "SELECT name || ':' || version FROM model_versions ORDER BY name", "mlflow"
    )
    assert versions.splitlines() == [f"{EXPERIMENT}-{name}:1" for name in sorted(TRAINED)]
    # served artifacts land in the chart's artifact destination (here a shared folder)
    model_files = list((services_root / "artifacts").rglob("model.safetensors"))
    assert len(model_files) >= len(TRAINED)


def test_compare_through_both_servers(
    flow_run: dict[str, Any],
    prefect: PrefectCli,
    mlflow_service: ServiceProcess,
    tmp_path: Path,
) -> None:
    out = tmp_path / "compare"
    done = subprocess.run(
        [sys.executable, "-m", "flows", "compare", EXPERIMENT,
         "--mlflow-tracking-uri", mlflow_service.url, "--out", str(out)],
        cwd=REPO, env=prefect.env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 GRPO steps" in done.stdout
    assert (out / "comparison.png").read_bytes()[:8] == PNG_MAGIC
    client = MlflowClient(mlflow_service.url)
    parent = _parent_run(client, flow_run["id"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (comparison,) = client.search_runs(
        [experiment.experiment_id], f"tags.`llmrl.compared_runs` = '{parent.info.run_id}'"
    )
    assert "comparison.png" in {a.path for a in client.list_artifacts(comparison.info.run_id)}
    runs = prefect.post("/flow_runs/filter", {"flow_runs": {"name": {"like_": "compare-"}}})
    (compare_run,) = [r for r in runs if r["name"] == f"compare-{EXPERIMENT}"]
    assert compare_run["state"]["type"] == "COMPLETED"
    keys = {a["key"] for a in prefect.of_flow_run("artifacts", compare_run["id"])}
    assert {"llmrl-comparison", "llmrl-comparison-summary"} <= keys


def _snapshot(prefect: PrefectCli, mlflow_url: str, flow_run_id: str) -> dict[str, Any]:
    """What the two servers hold about the flow run, through their APIs."""
    client = MlflowClient(mlflow_url)
    parent = _parent_run(client, flow_run_id)
    children = child_runs(client, EXPERIMENT, parent.info.run_id)
    return {
        "state": prefect.get(f"/flow_runs/{flow_run_id}")["state"]["type"],
        "artifacts": sorted(a["id"] for a in prefect.of_flow_run("artifacts", flow_run_id)),
        "deployments": sorted(d["name"] for d in prefect.post("/deployments/filter", {})),
        "runs": {name: run.info.status for name, run in children.items()},
        "history": {
            name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for name, key in (("sft", "loss"), ("grpo", "reward_mean"))
            for run in [children[name]]
        },
        "versions": sorted(
            (v.name, v.version) for v in client.search_model_versions(f"name LIKE '{EXPERIMENT}%'")
        ),
    }


def test_a_database_and_a_server_restart_lose_nothing(
    flow_run: dict[str, Any],
    prefect: PrefectCli,
    prefect_service: ServiceProcess,
    mlflow_service: ServiceProcess,
    postgres: PostgresCluster,
) -> None:
    before = _snapshot(prefect, mlflow_service.url, flow_run["id"])
    assert before["state"] == "COMPLETED" and len(before["artifacts"]) >= 4

    postgres.restart()  # both servers keep running and reconnect
    assert _snapshot(prefect, mlflow_service.url, flow_run["id"]) == before

    prefect_service.restart()  # a server start on an existing, migrated database
    assert _snapshot(prefect, mlflow_service.url, flow_run["id"]) == before

    # and it takes writes again: a second run of the deployment, every stage already finished
    second = run_once(prefect, f"llmrl-pipeline/{DEPLOYMENT}", POOL, timeout=FLOW_RUN_S)
    assert prefect.get(f"/flow_runs/{second}")["state"]["type"] == "COMPLETED"
    client = MlflowClient(mlflow_service.url)
    assert _parent_run(client, second).info.status == "FINISHED"
    assert _snapshot(prefect, mlflow_service.url, flow_run["id"]) == before
