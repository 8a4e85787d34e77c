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

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart import NAMESPACE, objects
from tests.support.chart_services import (
    DATABASE_SECRETS,
    chart_service,
    database_secrets,
    deployment,
)
from tests.support.postgres import PostgresCluster, missing_reason
from tests.support.service_process import ServiceProcess, free_port

PREFECT_SECRET = "llmrl-prefect-db"
"""The guide's Secret of the Prefect server's database (the chart's values name it)."""


def _secrets(postgres: PostgresCluster) -> dict[str, dict[str, str]]:
    return database_secrets(postgres.user, postgres.password, postgres.host, postgres.port)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the module, with the databases the guide names."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster()
    try:
        cluster.start()
        for database in DATABASE_SECRETS.values():
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
    return objects(chart.render(values, name="llmrl", namespace=NAMESPACE))


@contextmanager
def _running(
    postgres: PostgresCluster, render: list[dict[str, Any]], name: str, root: Path, *volumes: str
) -> Iterator[ServiceProcess]:
    """Deployment ``name`` of the render running on ``postgres``, its volumes folders under
    ``root/<name>``; stopped on exit."""
    folders = {volume: root / name / volume for volume in volumes}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    service = chart_service(
        deployment(render, name), secrets=_secrets(postgres), volumes=folders, root=root
    )
    service.start(timeout=120)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def mlflow_service(
    postgres: PostgresCluster, chart_render: list[dict[str, Any]], services_root: Path
) -> Iterator[ServiceProcess]:
    """The chart's MLflow server on ``postgres``; ``.url`` is the tracking URI."""
    with _running(postgres, chart_render, "llmrl-mlflow", services_root, "tmp") as service:
        yield service


@pytest.fixture(scope="module")
def prefect_service(
    postgres: PostgresCluster, chart_render: list[dict[str, Any]], services_root: Path
) -> Iterator[ServiceProcess]:
    """The chart's Prefect server on ``postgres``; its API is ``.url + "/api"``."""
    name = "llmrl-prefect-server"
    with _running(postgres, chart_render, name, services_root, "tmp", "data") as service:
        yield service
