"""Run a Kubernetes container spec in one of llmrl's built images, as a kubelet would, without a
container runtime (``tests/images``; the images come from ``make images``).

:class:`ImageRoot` is a throwaway buildah container of an image: its root file system mounted
on this machine and the image's config (``Env``, ``User``, ``WorkingDir``, ``Entrypoint``,
``Cmd``). :func:`pod_argv` turns one container of a rendered pod (the chart's Deployments, the
launcher's Jobs and RayJobs) into a command line that runs it there:

- the command line: the container's ``command`` replaces the image's ENTRYPOINT and its
  ``args`` the CMD, as Kubernetes does;
- the user: the container's or the pod's ``runAsUser``/``runAsGroup`` (else the image's USER),
  with ``fsGroup`` as a supplementary group, and no capability (``chroot --userspec`` drops
  root for real: root-owned paths of the image stay unwritable);
- the file system: the image's root, read-only when ``readOnlyRootFilesystem`` says so; each
  volume mount a folder the test gives (``readOnly`` honoured; an ``emptyDir`` the test does not
  give is a new folder owned by ``fsGroup``, as the kubelet makes it), ``/proc`` of a new PID
  namespace, the host's ``/dev`` and ``/sys``, a ``tmpfs`` on ``/dev/shm`` unless the pod
  mounts one, and the host's ``/etc/hosts`` and ``/etc/resolv.conf`` (host network);
- the environment: the image's ``Env``, then the container's ``env`` (values and
  ``secretKeyRef`` from the test's secrets), ``HOME`` from the image's ``/etc/passwd`` for that
  user when the container sets none (the container runtimes' rule);
- the working directory: the container's ``workingDir``, else the image's.

It runs in new mount and PID namespaces (``unshare``): killing the command kills every process
the container started (Ray's daemons included). What it does not give: resource limits, a
network namespace, seccomp; those are the cluster's, and the chart's tests check them as
objects.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")
"""Files a container runtime writes into every container (host network here)."""


def _buildah(*args: str) -> str:
    done = subprocess.run(["buildah", *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


@dataclass
class ImageRoot:
    """A buildah container of ``image``: its mounted root and the image's config."""

    image: str
    container: str = ""
    root: Path = field(default_factory=Path)
    config: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> ImageRoot:
        self.container = _buildah("from", "--pull-never", self.image)
        self.root = Path(_buildah("mount", self.container))
        inspected = json.loads(_buildah("inspect", "--type", "image", self.image))
        self.config = inspected["Docker"]["config"]
        return self

    def __exit__(self, *_: object) -> None:
        subprocess.run(["buildah", "umount", self.container], capture_output=True)
        subprocess.run(["buildah", "rm", self.container], capture_output=True)

    def env(self) -> dict[str, str]:
        """The image's ``Env``."""
        return dict(item.split("=", 1) for item in self.config.get("Env") or [])

    def home_of(self, uid: int) -> str:
        """The home folder ``/etc/passwd`` gives ``uid`` in the image, or ``/``."""
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[2] == str(uid):
                return fields[5]
        return "/"

    def user(self) -> tuple[int, int]:
        """The image's USER as ``(uid, gid)`` (numbers only: the Dockerfile's ``USER 10001``)."""
        user = self.config.get("User") or "0"
        uid, _, gid = user.partition(":")
        return int(uid), int(gid or uid)


@dataclass
class PodContainer:
    """One container of a pod spec, with what the test stands in for."""

    container: dict[str, Any]
    pod: dict[str, Any] = field(default_factory=dict)
    volumes: Mapping[str, Path] = field(default_factory=dict)
    """``{volume name: host folder}``; an emptyDir not named here gets a new folder."""
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Set after the container's env (what the cluster would inject, e.g. a Service's address)."""
    argv: list[str] | None = None
    """Replaces the container's command line (a RayJob's entrypoint runs in the head's)."""


def _security(spec: PodContainer, image: ImageRoot) -> tuple[int, int, int | None, bool]:
    pod_ctx = spec.pod.get("securityContext", {})
    ctx = spec.container.get("securityContext", {})
    image_uid, image_gid = image.user()
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser", image_uid))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup", image_gid))
    if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) and uid == 0:
        raise PermissionError(f"container {spec.container['name']}: runAsNonRoot, but uid 0")
    return int(uid), int(gid), pod_ctx.get("fsGroup"), bool(ctx.get("readOnlyRootFilesystem"))


def _env(spec: PodContainer, image: ImageRoot, uid: int) -> dict[str, str]:
    env = image.env()
    where = f"container {spec.container['name']}"
    for source in spec.container.get("envFrom", []):
        if "secretRef" in source:
            env.update(spec.secrets[source["secretRef"]["name"]])
    for var in spec.container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            if ref["key"] not in spec.secrets.get(ref["name"], {}):
                raise KeyError(
                    f"{where}: env {var['name']} reads Secret {ref['name']}/{ref['key']}"
                )
            env[var["name"]] = spec.secrets[ref["name"]][ref["key"]]
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = {"metadata.namespace": "llmrl", "status.podIP": "127.0.0.1"}.get(
                var["valueFrom"]["fieldRef"]["fieldPath"], "test-pod"
            )
        else:
            raise ValueError(f"{where}: env {var['name']} comes from {var.get('valueFrom')}")
    env.setdefault("HOME", image.home_of(uid))
    env.update(spec.extra_env)
    return env


def _argv(spec: PodContainer, image: ImageRoot) -> list[str]:
    if spec.argv is not None:
        return list(spec.argv)
    command = spec.container.get("command")
    args = spec.container.get("args")
    if command:
        return [str(w) for w in [*command, *(args or [])]]
    entry = image.config.get("Entrypoint") or []
    return [
        str(w) for w in [*entry, *(args if args is not None else image.config.get("Cmd") or [])]
    ]


def pod_argv(spec: PodContainer, image: ImageRoot, scratch: Path) -> list[str]:
    """The host command line that runs ``spec`` in ``image`` (see the module docstring).

    ``scratch`` holds the emptyDirs the test did not give."""
    uid, gid, fs_group, read_only = _security(spec, image)
    root = image.root
    mounts = {m["mountPath"]: m for m in spec.container.get("volumeMounts", [])}
    pod_volumes = {v["name"]: v for v in spec.pod.get("volumes", [])}
    script = ["set -e", "mount --make-rprivate /"]
    binds: list[tuple[str, str, bool]] = []
    for path, mount in mounts.items():
        name = mount["name"]
        if name in spec.volumes:
            source = Path(spec.volumes[name])
        elif "emptyDir" in pod_volumes.get(name, {}):
            source = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))
            if fs_group is not None:
                subprocess.run(["chown", f"0:{fs_group}", str(source)], check=True)
                source.chmod(0o2777 if pod_volumes[name]["emptyDir"].get("medium") else 0o2775)
        else:
            raise KeyError(f"container {spec.container['name']} mounts {name!r}: no folder given")
        binds.append((str(source), path, bool(mount.get("readOnly"))))
    # Mount points are made in the container's own (writable) layer, as a runtime does, before
    # the root turns read-only.
    for _, path, _ in binds:
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for name in ("proc", "dev", "sys", "dev/shm"):
        (root / name).mkdir(parents=True, exist_ok=True)
    script.append(f"mount --bind {root} {root}")
    if read_only:
        script.append(f"mount -o remount,bind,ro {root}")
    script += [
        f"mount --rbind /dev {root}/dev",
        f"mount --rbind /sys {root}/sys",
        f"mount -t proc proc {root}/proc",
    ]
    if "/dev/shm" not in mounts:
        script.append(f"mount -t tmpfs -o mode=1777 shm {root}/dev/shm")
    for host_file in HOST_FILES:
        target = root / host_file.lstrip("/")
        if target.exists():
            script.append(f"mount --bind {host_file} {target}")
    for source, path, ro in binds:
        target = root / path.lstrip("/")
        script.append(f"mount --bind {shlex.quote(source)} {shlex.quote(str(target))}")
        if ro:
            script.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
    env = _env(spec, image, uid)
    workdir = spec.container.get("workingDir") or image.config.get("WorkingDir") or "/"
    groups = f"--groups={fs_group} " if fs_group is not None else ""
    exports = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    command = " ".join(shlex.quote(word) for word in _argv(spec, image))
    script.append(
        f"exec env -i {shutil.which('chroot')} --userspec={uid}:{gid} {groups}{root} "
        f"/usr/bin/env -i {exports} /usr/bin/env --chdir={shlex.quote(workdir)} {command}"
    )
    return [
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "/bin/sh",
        "-c",
        "\n".join(script),
    ]


def run_in_image(
    spec: PodContainer, image: ImageRoot, scratch: Path, timeout: float
) -> subprocess.CompletedProcess:
    """Run ``spec`` to completion in ``image``; output captured (stdout and stderr merged)."""
    return subprocess.run(
        pod_argv(spec, image, scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
