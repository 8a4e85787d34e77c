"""A least-privilege checker for the RBAC objects llmrl installs.

:func:`rbac_violations` holds Roles, RoleBindings, ClusterRoles and ClusterRoleBindings to
one namespace: no cluster-scoped grants (unless allow-listed with a reason), no wildcards, no
verbs that hand out more rights (escalate, bind, impersonate), no reading of Secrets (nothing
llmrl runs needs them through the API: pods get theirs as mounted env/volumes), none of the
subresources that amount to a shell or a token in another identity, and bindings only of
Roles to ServiceAccounts of the same namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RBAC_KINDS = frozenset({"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})
CLUSTER_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding"})
FORBIDDEN_VERBS = frozenset({"escalate", "bind", "impersonate"})
SECRET_VERBS = frozenset({"get", "list", "watch"})
# Subresources and resources whose use is a way around the Role: a shell in, or a token of,
# another workload, or rewriting RBAC itself.
FORBIDDEN_RESOURCES = frozenset(
    {
        "pods/exec",
        "pods/attach",
        "pods/portforward",
        "pods/ephemeralcontainers",
        "serviceaccounts/token",
        "nodes/proxy",
        "roles",
        "rolebindings",
        "clusterroles",
        "clusterrolebindings",
        "certificatesigningrequests/approval",
    }
)


def rbac_violations(
    objects: Iterable[Mapping[str, Any]],
    namespace: str,
    cluster_allowed: Mapping[str, str] | None = None,
) -> list[str]:
    """Every least-privilege rule the RBAC objects among ``objects`` break.

    ``cluster_allowed`` maps ``Kind/name`` of a cluster-scoped object that is allowed
    anyway to the reason it must be (an explicit, documented exception).
    """
    found: list[str] = []
    for obj in objects:
        kind = obj.get("kind")
        if kind not in RBAC_KINDS:
            continue
        metadata = obj.get("metadata") or {}
        who = f"{kind}/{metadata.get('name')}"
        if kind in CLUSTER_KINDS and who not in (cluster_allowed or {}):
            found.append(f"{who}: cluster-scoped; grant rights in namespace {namespace} only")
        elif kind not in CLUSTER_KINDS and metadata.get("namespace") != namespace:
            found.append(f"{who}: namespace {metadata.get('namespace')!r}, not {namespace!r}")
        if kind.endswith("Binding"):
            found += _binding_violations(who, obj, namespace)
        else:
            for i, rule in enumerate(obj.get("rules") or []):
                found += _rule_violations(f"{who} rule {i}", rule)
    return found


def _rule_violations(who: str, rule: Mapping[str, Any]) -> list[str]:
    found = []
    for field in ("apiGroups", "resources", "verbs", "resourceNames"):
        if "*" in (rule.get(field) or []):
            found.append(f"{who}: wildcard in {field}")
    if rule.get("nonResourceURLs"):
        found.append(f"{who}: nonResourceURLs are cluster-wide")
    verbs, resources = set(rule.get("verbs") or []), set(rule.get("resources") or [])
    if verbs & FORBIDDEN_VERBS:
        found.append(f"{who}: verbs {sorted(verbs & FORBIDDEN_VERBS)} hand out more rights")
    if resources & FORBIDDEN_RESOURCES:
        found.append(f"{who}: resources {sorted(resources & FORBIDDEN_RESOURCES)} are forbidden")
    if "secrets" in resources and verbs & SECRET_VERBS:
        found.append(f"{who}: reads secrets ({sorted(verbs & SECRET_VERBS)})")
    return found


def _binding_violations(who: str, binding: Mapping[str, Any], namespace: str) -> list[str]:
    found = []
    role_kind = (binding.get("roleRef") or {}).get("kind")
    if binding.get("kind") == "RoleBinding" and role_kind != "Role":
        found.append(f"{who}: binds a {role_kind}, not a Role of its namespace")
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind != "ServiceAccount":
            found.append(f"{who}: subject {kind}/{name} is not a ServiceAccount")
        elif subject.get("namespace") != namespace:
            found.append(f"{who}: subject ServiceAccount/{name} is in {subject.get('namespace')!r}")
    return found
