"""Fixtures of the services tests: a real PostgreSQL, and on it the MLflow and Prefect servers
the Helm chart deploys, started from the chart's own render.

One source of the settings: the Secrets hold the connection URIs written the way
``docs/deploy-gpu-cluster.md`` tells an operator to create them (its ``kubectl create secret``
lines, with this cluster's user, password, host and port filled in), the chart is rendered with
values that name those Secrets, and :mod:`tests.support.chart_services` runs each server with
exactly the command and environment of its rendered Deployment. A wrong driver in the docs' URI,
a wrong key or variable in the chart, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart import objects
from tests.support.chart_services import chart_service, deployment
from tests.support.paths import REPO
from tests.support.postgres import PostgresCluster, missing_reason
from tests.support.service_process import ServiceProcess, free_port

GUIDE = REPO / "docs" / "deploy-gpu-cluster.md"
MLFLOW_SECRET, PREFECT_SECRET = "llmrl-mlflow-db", "llmrl-prefect-db"
"""The Secrets the guide creates for the two servers' databases (the chart's value names)."""
DATABASES = {MLFLOW_SECRET: "mlflow", PREFECT_SECRET: "prefect"}
"""The database each Secret's URI names in the guide."""

_SECRET_LINE = re.compile(
    r"create secret generic (?P<name>[\w-]+) \\\n\s*--from-literal=(?P<key>\w+)='(?P<value>[^']+)'"
)


def guide_secrets() -> dict[str, dict[str, str]]:
    """``{name: {key: value}}`` of every ``kubectl create secret generic ... --from-literal``
    of the deployment guide, as written there (placeholders included)."""
    found: dict[str, dict[str, str]] = {}
    for match in _SECRET_LINE.finditer(GUIDE.read_text()):
        found.setdefault(match["name"], {})[match["key"]] = match["value"]
    return found


def database_secrets(postgres: PostgresCluster) -> dict[str, dict[str, str]]:
    """The guide's two database Secrets with ``postgres``'s user, password, host and port in
    place of USER, PASSWORD and POSTGRES_HOST:5432."""
    written = guide_secrets()
    secrets = {}
    for name in DATABASES:
        assert name in written, f"{GUIDE.name} no longer creates Secret {name}"
        secrets[name] = {
            key: value.replace("USER", postgres.user)
            .replace("PASSWORD", postgres.password)
            .replace("POSTGRES_HOST:5432", f"{postgres.host}:{postgres.port}")
            for key, value in written[name].items()
        }
    return secrets


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the module, with the databases the guide names."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster()
    try:
        cluster.start()
        for database in DATABASES.values():
            cluster.create_database(database)
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def services_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's folder: the servers' logs, volumes and the shared artifact folder."""
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="module")
def chart_render(chart: Any, services_root: Path) -> list[dict[str, Any]]:
    """The chart rendered with both servers on: MLflow with artifacts in a shared folder (the
    chart's ``--artifacts-destination``; on a cluster an S3 URI) and the in-chart Prefect server
    on the guide's database Secret, each on a free port."""
    from tests.helm.chart_objects import render

    values = {
        "mlflow": {
            "port": free_port(),
            "artifacts": {
                "destination": str(services_root / "artifacts"),
                "s3EndpointUrl": "",
                "credentialsSecret": "",
            },
        },
        "prefect": {
            "apiUrl": "",
            "server": {
                "enabled": True,
                "port": free_port(),
                "database": {"name": PREFECT_SECRET, "key": "url"},
            },
        },
    }
    return objects(render(chart, values))


def _volumes(root: Path, *names: str) -> dict[str, Path]:
    folders = {}
    for name in names:
        folders[name] = root / name
        folders[name].mkdir(parents=True, exist_ok=True)
    return folders


@pytest.fixture(scope="module")
def mlflow_service(
    postgres: PostgresCluster, chart_render: list[dict[str, Any]], services_root: Path
) -> Iterator[ServiceProcess]:
    """The chart's MLflow server on ``postgres``; ``.url`` is the tracking URI."""
    service = chart_service(
        deployment(chart_render, "llmrl-mlflow"),
        secrets=database_secrets(postgres),
        volumes=_volumes(services_root / "mlflow", "tmp"),
        root=services_root,
    )
    service.start(timeout=120)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def prefect_service(
    postgres: PostgresCluster, chart_render: list[dict[str, Any]], services_root: Path
) -> Iterator[ServiceProcess]:
    """The chart's Prefect server on ``postgres``; its API is ``.url + "/api"``."""
    service = chart_service(
        deployment(chart_render, "llmrl-prefect-server"),
        secrets=database_secrets(postgres),
        volumes=_volumes(services_root / "prefect", "tmp", "data"),
        root=services_root,
    )
    service.start(timeout=120)
    try:
        yield service
    finally:
        service.stop()
