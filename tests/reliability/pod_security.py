"""A checker for the Kubernetes "restricted" Pod Security Standard (policy version v1.30).

:func:`restricted_violations` applies the standard's baseline and restricted rules, as the
Pod Security Admission controller does, to one pod spec (with its template's annotations);
:func:`pod_specs` finds every pod spec inside any object (Pod, Deployment, Job, RayCluster,
RayJob and its embedded RayCluster and submitter, ...). Rules and allowed values:
https://kubernetes.io/docs/concepts/security/pod-security-standards/
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

ALLOWED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
ALLOWED_ADDED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_APPARMOR = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
POD_VOLUME_FIELDS = frozenset({"name"})  # a volume's keys besides its (single) type


def pod_specs(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """``(where, pod spec, annotations)`` of every pod spec (a ``spec`` with ``containers``)
    under ``node``, ``where`` being its parent's path such as ``spec.template``."""
    if isinstance(node, Mapping):
        spec = node.get("spec")
        if isinstance(spec, Mapping) and isinstance(spec.get("containers"), list):
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            yield where or ".", dict(spec), dict(annotations)
            return  # a pod spec holds no other pod spec
        for key, value in node.items():
            yield from pod_specs(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pod_specs(value, f"{where}[{i}]")


def restricted_violations(
    spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None
) -> list[str]:
    """Every rule of the restricted standard that ``spec`` breaks, as readable messages."""
    found: list[str] = []
    pod_context = spec.get("securityContext") or {}
    containers = [(c.get("name", "?"), c) for kind in CONTAINER_LISTS for c in spec.get(kind) or []]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            found.append(f"pod: {field} must be unset or false")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - POD_VOLUME_FIELDS
        if not kinds <= ALLOWED_VOLUME_TYPES:
            found.append(f"volume {volume.get('name')!r}: type {sorted(kinds)} is not allowed")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"pod: sysctl {sysctl.get('name')!r} is not allowed")
    for key, value in (annotations or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"pod: AppArmor annotation {key}={value!r} is not allowed")
    found += _context_violations("pod", pod_context)
    if (pod_context.get("seccompProfile") or {}).get("type") not in ALLOWED_SECCOMP:
        for name, container in containers:
            context = container.get("securityContext") or {}
            if (context.get("seccompProfile") or {}).get("type") not in ALLOWED_SECCOMP:
                found.append(f"{name}: seccompProfile.type must be RuntimeDefault or Localhost")
    for name, container in containers:
        context = container.get("securityContext") or {}
        found += _context_violations(name, context)
        found += _container_violations(name, container, context, pod_context)
    return found


def _context_violations(who: str, context: Mapping[str, Any]) -> list[str]:
    """Rules that hold for a pod's and a container's securityContext alike."""
    found = []
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{who}: windowsOptions.hostProcess must be unset or false")
    if context.get("runAsNonRoot") is False:
        found.append(f"{who}: runAsNonRoot must not be false")
    if context.get("runAsUser") == 0:
        found.append(f"{who}: runAsUser must not be 0")
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in ALLOWED_SECCOMP:
        found.append(f"{who}: seccompProfile.type {seccomp!r} is not allowed")
    apparmor = (context.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in ALLOWED_APPARMOR:
        found.append(f"{who}: appArmorProfile.type {apparmor!r} is not allowed")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in ALLOWED_SELINUX_TYPES:
        found.append(f"{who}: seLinuxOptions.type {selinux['type']!r} is not allowed")
    for field in ("user", "role"):
        if selinux.get(field):
            found.append(f"{who}: seLinuxOptions.{field} must be unset")
    return found


def _container_violations(
    name: str,
    container: Mapping[str, Any],
    context: Mapping[str, Any],
    pod_context: Mapping[str, Any],
) -> list[str]:
    found = []
    if context.get("privileged"):
        found.append(f"{name}: privileged must be unset or false")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"{name}: allowPrivilegeEscalation must be false")
    if context.get("procMount", "Default") != "Default":
        found.append(f"{name}: procMount must be Default")
    if context.get("runAsNonRoot") is not True and pod_context.get("runAsNonRoot") is not True:
        found.append(f"{name}: runAsNonRoot must be true (in the pod or the container)")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"{name}: capabilities.drop must contain ALL")
    added = set(capabilities.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
    if added:
        found.append(
            f"{name}: capabilities.add may only hold NET_BIND_SERVICE, not {sorted(added)}"
        )
    for port in container.get("ports") or []:
        if port.get("hostPort"):
            found.append(f"{name}: hostPort {port['hostPort']} is not allowed")
    return found
