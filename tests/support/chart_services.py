"""The chart's service pods run as local processes: the MLflow and Prefect servers exactly as the
helm/llmrl chart renders them (command, arguments, environment), so a mistake in the chart's
Deployments fails the services tests (``tests/services``).

What Kubernetes would supply the test supplies, and nothing else:

- ``secretKeyRef`` values come from ``secrets`` (``{secret name: {key: value}}``); a key the
  chart reads and the test does not have is an error naming both;
- each volume mount is a local folder (``volumes``: ``{volume name: folder}``); environment
  values under a mount path (``HOME=/tmp``, ``PREFECT_HOME=/data/prefect``) are rewritten to the
  folder. Arguments are not: the chart's come from values, which the test gives as local paths;
- the container's executable is this environment's (``.venv/bin/mlflow``, ``.venv/bin/prefect``):
  the images run the same versions (``tests/helm/test_chart_services.py`` checks the tags);
- the process environment is the container's: ``PATH`` and ``LANG`` plus what the chart sets.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.paths import REPO
from tests.support.service_process import ServiceProcess

GUIDE = REPO / "docs" / "deploy-gpu-cluster.md"
"""The deployment guide, whose ``kubectl create secret`` lines the operator runs."""
DATABASE_SECRETS = {"llmrl-mlflow-db": "mlflow", "llmrl-prefect-db": "prefect"}
"""The Secrets the guide creates for the two servers' databases, and the database each names."""

_SECRET_LINE = re.compile(
    r"create secret generic (?P<name>[\w-]+) \\\n\s*--from-literal=(?P<key>\w+)='(?P<value>[^']+)'"
)

BASE_ENV = {"LANG": "C.UTF-8"}
"""What the images' environment holds besides ``PATH`` (this environment's ``bin`` first)."""


def guide_secrets() -> dict[str, dict[str, str]]:
    """``{name: {key: value}}`` of every ``kubectl create secret generic ... --from-literal``
    of the deployment guide, as written there (placeholders included)."""
    found: dict[str, dict[str, str]] = {}
    for match in _SECRET_LINE.finditer(GUIDE.read_text()):
        found.setdefault(match["name"], {})[match["key"]] = match["value"]
    return found


def database_secrets(user: str, password: str, host: str, port: int) -> dict[str, dict[str, str]]:
    """The guide's two database Secrets with ``user``, ``password`` and ``host:port`` in place
    of its USER, PASSWORD and POSTGRES_HOST:5432."""
    written = guide_secrets()
    secrets = {}
    for name in DATABASE_SECRETS:
        if name not in written:
            raise LookupError(f"{GUIDE.name} no longer creates Secret {name}")
        secrets[name] = {
            key: value.replace("USER", user)
            .replace("PASSWORD", password)
            .replace("POSTGRES_HOST:5432", f"{host}:{port}")
            for key, value in written[name].items()
        }
    return secrets


def deployment(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The rendered Deployment called ``name``."""
    found = [i for i in items if i["kind"] == "Deployment" and i["metadata"]["name"] == name]
    if len(found) != 1:
        names = sorted(i["metadata"]["name"] for i in items if i["kind"] == "Deployment")
        raise LookupError(f"the render has no Deployment {name!r}: it has {names}")
    return found[0]


def _remap(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` with a leading mount path replaced by its local folder (longest match)."""
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(mounts[mount]) + value[len(mount.rstrip("/")) :]
    return value


def _secret(secrets: Mapping[str, Mapping[str, str]], ref: Mapping[str, str], what: str) -> str:
    name, key = ref["name"], ref["key"]
    if name not in secrets or key not in secrets[name]:
        raise KeyError(f"{what} reads Secret {name!r} key {key!r}, which the test does not hold")
    return secrets[name][key]


def container_command(
    item: dict[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, str]],
    volumes: Mapping[str, Path],
) -> tuple[list[str], dict[str, str], int, str]:
    """``(argv, env, port, health path)`` of the one container of Deployment ``item``: the port
    and path of its readiness probe."""
    spec = item["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    where = f"{item['metadata']['name']}: container {container['name']}"
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            raise KeyError(f"{where} mounts volume {mount['name']!r}: the test gave no folder")
        mounts[mount["mountPath"]] = volumes[mount["name"]]

    argv = [str(word) for word in [*container.get("command", []), *container.get("args", [])]]
    executable = Path(sys.executable).parent / argv[0]
    if not executable.exists():
        raise FileNotFoundError(f"{where} runs {argv[0]!r}, which this environment lacks")
    argv[0] = str(executable)

    env = {**BASE_ENV, "PATH": f"{executable.parent}:/usr/local/bin:/usr/bin:/bin"}
    for source in container.get("envFrom", []):
        if "secretRef" not in source:
            raise ValueError(f"{where}: envFrom {source} is not a Secret")
        env.update(secrets[source["secretRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _remap(str(var["value"]), mounts)
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[var["name"]] = _secret(secrets, var["valueFrom"]["secretKeyRef"], var["name"])
        else:
            raise ValueError(f"{where}: env {var['name']} comes from {var.get('valueFrom')}")

    probe = container["readinessProbe"]["httpGet"]
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    port = ports[probe["port"]] if isinstance(probe["port"], str) else int(probe["port"])
    return argv, env, port, probe["path"]


WORKER_HEALTHCHECK_S = 60
"""Seconds uvicorn's supervisor waits for a worker's health answer here (its default: 5)."""


def chart_service(
    item: dict[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, str]],
    volumes: Mapping[str, Path],
    root: Path,
) -> ServiceProcess:
    """Deployment ``item``'s container as a :class:`ServiceProcess` (not started), logging to
    ``root/<name>.log``, healthy when its readiness probe answers on 127.0.0.1."""
    argv, env, port, path = container_command(item, secrets=secrets, volumes=volumes)
    name = item["metadata"]["name"]
    # MLflow's server runs uvicorn with several workers (the chart's --workers), each importing
    # MLflow (3-4 s of CPU alone). uvicorn's supervisor kills a worker that has not answered its
    # health check within 5 s and starts another: on 2 cores beside the slow tier's other
    # modules that looped until the start deadline (seen once, 2026-12-07). A pod has its own
    # CPUs; here the check waits as long as a loaded machine needs to import it.
    env = {**env, "UVICORN_TIMEOUT_WORKER_HEALTHCHECK": str(WORKER_HEALTHCHECK_S)}
    return ServiceProcess(
        argv, env, port=port, health_url=f"http://127.0.0.1:{port}{path}",
        log_path=root / f"{name}.log", cwd=root, name=name,
    )  # fmt: skip
