"""Kubernetes RBAC for the tests: the launcher's Role, and an authorizer that enforces it.

- :func:`chart_role_rules`: the rules of ``helm/llmrl``'s Role, rendered by the real Helm
  engine (helm-python-sdk); :func:`manifest_role_rules`: those of ``k8s/launcher-rbac.yaml``.
- :func:`request_attributes`: what the API server's authorizer sees of a request (verb, API
  group, resource, subresource, namespace, name), mapped as the real server maps it.
- :func:`allows` / :func:`forbidden_status`: the RBAC decision and the 403 Status body.
- :data:`PREFECT_WORKER_CALLS`: what the Prefect Kubernetes worker itself asks of the API.

Example::

    attributes = request_attributes("GET", "/api/v1/namespaces/llmrl/pods/p1/log")
    attributes.permission  # Permission(group='', resource='pods', subresource='log', verb='get')
    allows(chart_role_rules(), attributes)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlparse

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "llmrl"
RBAC_MANIFEST = REPO / "k8s" / "launcher-rbac.yaml"
LAUNCHER_USER = "system:serviceaccount:llmrl:llmrl-launcher"
Rules = Sequence[Mapping[str, Any]]


class Permission(NamedTuple):
    """One grantable thing: ``(apiGroup, resource, subresource, verb)``; ``""`` = core/none."""

    group: str
    resource: str
    subresource: str
    verb: str

    @property
    def resource_path(self) -> str:
        """``pods/log`` style, as Role rules spell a subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class Attributes(NamedTuple):
    """What the authorizer sees of one resource request."""

    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def permission(self) -> Permission:
        return Permission(self.group, self.resource, self.subresource, self.verb)


# ------------------------------------------------------------------------ the Prefect worker

PREFECT_WORKER_CALLS: frozenset[Permission] = frozenset(
    {
        # worker.py: _create_job -> create_namespaced_job; kill_infrastructure ->
        # delete_namespaced_job (propagation Foreground) when a flow run is cancelled.
        Permission("batch", "jobs", "", "create"),
        Permission("batch", "jobs", "", "delete"),
        # observer.py: kopf watches Jobs and Pods labelled prefect.io/flow-run-id (list, then
        # watch); _get_k8s_jobs lists a flow run's Jobs; _read_job_uid reads one Job.
        Permission("batch", "jobs", "", "list"),
        Permission("batch", "jobs", "", "watch"),
        Permission("batch", "jobs", "", "get"),
        Permission("", "pods", "", "list"),
        Permission("", "pods", "", "watch"),
        # observer.py: _fetch_crashed_pod_logs reads a crashed flow-run pod's log.
        Permission("", "pods", "log", "get"),
    }
)
"""What the Prefect Kubernetes worker (prefect-kubernetes 0.8.0, the release for prefect >=
3.8.4; its kopf observer restricted to the release namespace) asks of the API, read from its
``worker.py`` and ``observer.py``. Not in it: ``namespaces`` (0.8.0 never reads kube-system;
0.5.x did unless ``PREFECT_KUBERNETES_CLUSTER_UID`` was set, which the chart sets), ``events``
(0.5.x listed them; 0.7+ does not; kopf's event handlers log locally and post no Events), reads
of single pods (never), ``secrets`` (only with the worker's api-key/env-as-secret options, which
the chart leaves off)."""


# ------------------------------------------------------------------------ the Roles


@functools.cache
def _chart_role_rules(values_json: str) -> tuple[dict[str, Any], ...]:
    import json

    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(json.loads(values_json), name="llmrl", namespace="llmrl")
    roles = [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc and doc.get("kind") == "Role"
    ]
    if len(roles) != 1:
        raise AssertionError(f"the chart renders {len(roles)} Roles, expected 1")
    return tuple(roles[0]["rules"])


def chart_role_rules(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rules of the chart's Role, rendered by the real Helm engine with ``values``."""
    import json

    return [dict(rule) for rule in _chart_role_rules(json.dumps(values or {}, sort_keys=True))]


def manifest_role_rules(path: Path = RBAC_MANIFEST) -> list[dict[str, Any]]:
    """The rules of the Role in ``k8s/launcher-rbac.yaml``."""
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    (role,) = [doc for doc in docs if doc["kind"] == "Role"]
    return role["rules"]


def default_rules() -> list[dict[str, Any]]:
    """The chart's Role; ``k8s/launcher-rbac.yaml``'s (the same rules, tests/flows/test_rbac.py)
    when helm-python-sdk is not installed."""
    try:
        import helm_python  # noqa: F401
    except ImportError:
        return manifest_role_rules()
    return chart_role_rules()


def granted(rules: Rules) -> set[Permission]:
    """Every permission the rules grant, expanded (wildcards stay ``*``)."""
    found = set()
    for rule in rules:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                name, _, sub = resource.partition("/")
                for verb in rule.get("verbs") or []:
                    found.add(Permission(group, name, sub, verb))
    return found


def without(rules: Rules, resource: str) -> list[dict[str, Any]]:
    """``rules`` minus every grant on ``resource`` (e.g. ``"configmaps"``)."""
    kept = []
    for rule in rules:
        resources = [r for r in rule.get("resources") or [] if r != resource]
        if resources:
            kept.append({**rule, "resources": resources})
    return kept


# ------------------------------------------------------------------------ the authorizer


def request_attributes(method: str, url: str) -> Attributes | None:
    """The authorizer's view of a request, as the API server's RequestInfoFactory builds it;
    None for a non-resource URL (``/version``, ``/healthz``...)."""
    parsed = urlparse(url)
    parts = [part for part in parsed.path.split("/") if part]
    query = parse_qs(parsed.query)
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace = rest[1]  # also for the namespace object itself, as the server sets it
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    if not rest:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    verb = _verb(method, bool(name), _truthy(query.get("watch", ["false"])[0]))
    if not name and verb in ("list", "watch"):  # a list/watch of one name, by field selector
        for selector in query.get("fieldSelector", []):
            for requirement in selector.split(","):
                key, _, value = requirement.partition("=")
                if key == "metadata.name":
                    name = value.lstrip("=")
    return Attributes(verb, group, version, resource, subresource, namespace, name)


def _verb(method: str, named: bool, watch: bool) -> str:
    if method in ("GET", "HEAD"):
        if watch:
            return "watch"
        return "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _truthy(text: str) -> bool:
    """Go's strconv.ParseBool, true side."""
    return text in ("1", "t", "T", "true", "TRUE", "True")


def allows(rules: Rules, attributes: Attributes) -> bool:
    """Whether a Role with ``rules`` grants the request (RBAC's rule matching)."""
    resource = attributes.resource
    if attributes.subresource:
        resource = f"{resource}/{attributes.subresource}"
    for rule in rules:
        groups, verbs = rule.get("apiGroups") or [], rule.get("verbs") or []
        resources, names = rule.get("resources") or [], rule.get("resourceNames") or []
        if not ({"*", attributes.group} & set(groups) and {"*", attributes.verb} & set(verbs)):
            continue
        wildcard_sub = attributes.subresource and f"*/{attributes.subresource}" in resources
        if not ({"*", resource} & set(resources) or wildcard_sub):
            continue
        if names and attributes.name not in names:
            continue
        return True
    return False


def group_resource(attributes: Attributes) -> str:
    """``jobs.batch``, ``rayjobs.ray.io``, ``configmaps``: how errors name a resource."""
    return f"{attributes.resource}.{attributes.group}" if attributes.group else attributes.resource


def forbidden_message(attributes: Attributes, user: str = LAUNCHER_USER) -> str:
    """The RBAC part of a 403: ``User "..." cannot <verb> resource "..." in API group ...``."""
    resource = attributes.resource
    if attributes.subresource:
        resource = f"{resource}/{attributes.subresource}"
    where = (
        f'in the namespace "{attributes.namespace}"'
        if attributes.namespace
        else "at the cluster scope"
    )
    return (
        f'User "{user}" cannot {attributes.verb} resource "{resource}" '
        f'in API group "{attributes.group}" {where}'
    )


def forbidden_status(
    attributes: Attributes, user: str = LAUNCHER_USER, because: str | None = None
) -> dict[str, Any]:
    """The Status body of the API server's 403 Forbidden for ``attributes``."""
    what = group_resource(attributes)
    subject = f'{what} "{attributes.name}"' if attributes.name else what
    reason = because if because is not None else forbidden_message(attributes, user)
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"{subject} is forbidden: {reason}",
        "reason": "Forbidden",
        "details": {
            **({"name": attributes.name} if attributes.name else {}),
            **({"group": attributes.group} if attributes.group else {}),
            "kind": attributes.resource,
        },
        "code": 403,
    }


def resource_for(api_version: str, kind: str) -> tuple[str, str]:
    """``(group, plural)`` of a kind (what an ownerReference's apiVersion/kind map to)."""
    group = api_version.rpartition("/")[0]
    special = {"Endpoints": "endpoints"}
    plural = special.get(kind) or kind.lower() + ("es" if kind.endswith("s") else "s")
    return group, plural


def used_permissions(calls: Iterable[Attributes]) -> set[Permission]:
    """The distinct permissions a list of requests needed."""
    return {call.permission for call in calls}
