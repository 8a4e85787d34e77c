"""The services the helm/llmrl chart runs: MLflow (or an external server), the Prefect worker
and optional server, their versions, and the notes that say how to reach them and run."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.helm.chart_objects import of_kind, render
from tests.support.chart import VALUE_SETS, objects
from tests.support.chart_services import (
    DATABASE_SECRETS,
    container_command,
    database_secrets,
    deployment,
)
from tests.support.paths import REPO

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


def test_mlflow_uses_existing_secrets_or_an_external_server(chart, rendered):
    items = rendered("default")
    (deployment,) = [
        d for d in of_kind(items, "Deployment") if d["metadata"]["name"] == "llmrl-mlflow"
    ]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"] == {
        "name": "llmrl-mlflow-db",
        "key": "uri",
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "llmrl-mlflow-s3"
    assert container["command"][container["command"].index("--artifacts-destination") + 1] == (
        "s3://mlflow/artifacts"
    )
    assert [s["metadata"]["name"] for s in of_kind(items, "Service")] == ["llmrl-mlflow"]
    external = rendered("external-mlflow")
    assert "llmrl-mlflow" not in {d["metadata"]["name"] for d in of_kind(external, "Deployment")}
    (config,) = of_kind(external, "ConfigMap")
    stages = yaml.safe_load(config["data"]["stages.yaml"])
    assert stages["mlflow_tracking_uri"] == "https://mlflow.example.com"
    with pytest.raises(helm.HelmError, match=r"mlflow\.externalUri"):
        render(chart, {"mlflow": {"enabled": False}})


def test_servers_run_the_versions_llmrl_uses(rendered):
    """The MLflow server runs the client's MLflow (with a Postgres driver: the Dockerfile's
    mlflow target); the Prefect worker and server the Prefect of prefect.yaml."""
    import mlflow
    import prefect

    items = rendered("everything-on")
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in of_kind(items, "Deployment")
    }
    assert images["llmrl-mlflow"] == f"ghcr.io/llmrl/llmrl-mlflow:{mlflow.__version__}"
    project = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert project["prefect-version"] == prefect.__version__
    assert (
        images["llmrl-prefect-worker"]
        == f"prefecthq/prefect:{prefect.__version__}-python3.11-kubernetes"
    )
    assert images["llmrl-prefect-server"] == f"prefecthq/prefect:{prefect.__version__}-python3.11"


def test_prefect_worker_and_optional_server(chart, rendered):
    items = rendered("default")
    names = {d["metadata"]["name"] for d in of_kind(items, "Deployment")}
    assert "llmrl-prefect-server" not in names
    (worker,) = [
        d for d in of_kind(items, "Deployment") if d["metadata"]["name"] == "llmrl-prefect-worker"
    ]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:7] == [
        "prefect",
        "worker",
        "start",
        "--pool",
        "llmrl-k8s",
        "--type",
        "kubernetes",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PREFECT_API_URL"] == "http://prefect-server.prefect.svc:4200/api"
    assert worker["spec"]["template"]["spec"]["serviceAccountName"] == "llmrl"
    with_server = rendered("everything-on")
    assert {"llmrl-prefect-server"} <= {
        d["metadata"]["name"] for d in of_kind(with_server, "Deployment")
    }
    (worker,) = [
        d
        for d in of_kind(with_server, "Deployment")
        if d["metadata"]["name"] == "llmrl-prefect-worker"
    ]
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PREFECT_API_URL"]["value"] == "http://llmrl-prefect-server.llmrl.svc:4200/api"
    assert env["PREFECT_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "prefect-cloud"
    with pytest.raises(helm.HelmError, match=r"prefect\.apiUrl"):
        render(chart, {"prefect": {"apiUrl": ""}})


def test_notes_explain_access_and_how_to_run(chart):
    notes = render(chart, {})["llmrl/templates/NOTES.txt"]
    assert "kubectl -n llmrl port-forward svc/llmrl-mlflow 5000:5000" in notes
    (line,) = [x for x in notes.splitlines() if "prefect deployment run" in x]
    assert line.strip().startswith(
        "prefect deployment run 'llmrl-pipeline/default' --param params="
    )
    params = json.loads(line.split("params=", 1)[1].strip("'"))
    assert params["launcher"] == "kubernetes"
    assert params["work_dir"].startswith("/shared/")
    # The stage pods' settings are the release's, from kubernetes.yaml in its ConfigMap.
    assert "kubernetes" not in params
    assert "settings (key kubernetes.yaml)" in notes
    assert params["mlflow_tracking_uri"] == "http://llmrl-mlflow.llmrl.svc:5000"
    assert "trainer 1 rank(s) on 1 GPU(s) (single)" in notes
    cpu_ddp = render(chart, copy.deepcopy(VALUE_SETS["cpu-ddp"]))["llmrl/templates/NOTES.txt"]
    assert "trainer 2 rank(s) on 0 GPU(s) (ddp)" in cpu_ddp
    with_server = render(chart, copy.deepcopy(VALUE_SETS["everything-on"]))
    assert (
        "port-forward svc/llmrl-prefect-server 4200:4200"
        in with_server["llmrl/templates/NOTES.txt"]
    )


def test_the_servers_open_the_guides_database_uris_with_installed_drivers(chart, tmp_path):
    """The MLflow and Prefect servers of a render, resolved against the Secrets the deployment
    guide creates, get URIs whose SQLAlchemy driver this environment (and the images, at the
    same pins) has: psycopg 3 for MLflow's ``postgresql://``, asyncpg for Prefect's. The
    services tests (``tests/services``) then run both servers on a real PostgreSQL."""
    from sqlalchemy.engine import make_url

    values = {"prefect": {"server": {"enabled": True, "database": {"name": "llmrl-prefect-db",
                                                                   "key": "url"}}}}  # fmt: skip
    items = objects(render(chart, values))
    secrets = database_secrets("llmrl", "s3cret", "db.example", 5432)
    secrets["llmrl-mlflow-s3"] = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}
    volumes = {"tmp": tmp_path / "tmp", "data": tmp_path / "data"}
    variables = {"llmrl-mlflow": "MLFLOW_BACKEND_STORE_URI",
                 "llmrl-prefect-server": "PREFECT_API_DATABASE_CONNECTION_URL"}  # fmt: skip
    drivers = {}
    for name, variable in variables.items():
        _, env, _, _ = container_command(deployment(items, name), secrets=secrets, volumes=volumes)
        url = make_url(env[variable])
        assert (url.username, url.password, url.host, url.port) == (
            "llmrl", "s3cret", "db.example", 5432
        )  # fmt: skip
        assert url.database == DATABASE_SECRETS[f"{name.removesuffix('-server')}-db"]
        dialect = url.get_dialect()
        dialect.import_dbapi()  # ModuleNotFoundError when the driver is not installed
        drivers[name] = dialect.driver
    assert drivers == {"llmrl-mlflow": "psycopg", "llmrl-prefect-server": "asyncpg"}
    with pytest.raises(KeyError, match=r"Secret 'llmrl-mlflow-db' key 'uri'"):
        container_command(deployment(items, "llmrl-mlflow"), secrets={}, volumes=volumes)
