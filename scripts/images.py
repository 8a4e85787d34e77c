"""Build llmrl's images with buildah: no Docker daemon, no registry needed (docs/images.md).

    python3 scripts/images.py build cpu flow mlflow     # what `make images` runs
    python3 scripts/images.py build gpu                 # `make image-gpu`: torch and vLLM for CUDA
    python3 scripts/images.py report                    # sizes and build times of the last builds

Each target of the Dockerfile is built with ``buildah bud --isolation chroot --network host``
(no daemon; runs as root without a container runtime) and tagged as the chart and the Prefect
work pool expect it: ``REPOSITORY:VERSION`` (gpu), ``REPOSITORY:VERSION-cpu``,
``REPOSITORY:VERSION-flow`` and ``REPOSITORY-mlflow:MLFLOW_VERSION``. Push them to a registry
with ``buildah push IMAGE docker://REGISTRY/...``.

The base (the Dockerfile's PYTHON_BASE): ``--base IMAGE`` names one a registry serves
(``docker.io/library/python:3.11.13-slim-bookworm``, the Dockerfile's default). Without it, the
base is made here from Debian's packages: ``mmdebstrap`` writes a bookworm root file system with
Python 3.11 (``python3``, ``python3-venv``, ``python3-dev``, ``python-is-python3``) and buildah
imports it as ``localhost/llmrl-python-base:bookworm``. What differs from the official image:
Debian's Python 3.11.2 in /usr/bin instead of Python 3.11.13 built into /usr/local, and no pip
outside a venv; every target creates its own venv, so nothing in the Dockerfile sees either.

Packages come only from this machine's package index settings: its pip configuration (files and
``PIP_*`` variables: index URLs, find-links, certificate) is written into one ``pip.conf`` that
the build reads through ``PIP_CONFIG_FILE`` from a read-only mount, with the local folders it
names (find-links, ``file://`` indexes) mounted read-only at the same paths. Nothing of it lands
in an image. apt inside the build uses the base's Debian sources.

Each build's wall time and image size go to ``build/images/<target>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

import tomllib

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "build" / "images"
TARGETS = ("gpu", "cpu", "flow", "mlflow")
SMALL_TARGETS = ("cpu", "flow", "mlflow")

DEBIAN_BASE = "localhost/llmrl-python-base:bookworm"
DEBIAN_SUITE = "bookworm"
# What the Dockerfile needs of its base (see the module docstring), plus what python:slim also
# carries and Python programs expect: netbase (/etc/services), tzdata.
DEBIAN_PACKAGES = (
    "python3",
    "python3-venv",
    "python3-dev",
    "python-is-python3",
    "ca-certificates",
    "netbase",
    "tzdata",
)
DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")

# Inside the build: where the builder's pip.conf (and certificate) are mounted.
BUILD_MOUNT = "/run/llmrl-build"
# pip settings carried into the build, as pip.conf keys; PIP_<KEY> variables override the files.
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "trusted-host", "cert", "timeout")


def project_version() -> str:
    """llmrl's version (pyproject.toml): the images' tag."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def pinned(package: str, constraints: Path = REPO / "constraints.txt") -> str:
    """The version ``constraints`` pins for ``package``."""
    for line in constraints.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and name.strip().lower() == package:
            return version.split(";")[0].strip()
    raise LookupError(f"{constraints.name} pins no {package}")


def image_tag(target: str, repository: str) -> str:
    """The tag the chart (values.yaml) and the Prefect work pool expect for ``target``."""
    version = project_version()
    if target == "gpu":
        return f"{repository}:{version}"
    if target == "mlflow":
        return f"{repository}-mlflow:{pinned('mlflow')}"
    return f"{repository}:{version}-{target}"


def run(command: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(list(command), check=True, **kwargs)


def buildah(storage_driver: str | None, *args: str) -> list[str]:
    return ["buildah", *(["--storage-driver", storage_driver] if storage_driver else []), *args]


def image_exists(reference: str, storage_driver: str | None) -> bool:
    found = subprocess.run(
        buildah(storage_driver, "inspect", "--type", "image", reference),
        capture_output=True,
    )
    return found.returncode == 0


def debian_base(storage_driver: str | None, rebuild: bool = False) -> str:
    """The bookworm Python base made with mmdebstrap and imported by buildah (made once)."""
    if not rebuild and image_exists(DEBIAN_BASE, storage_driver):
        return DEBIAN_BASE
    RESULTS.mkdir(parents=True, exist_ok=True)
    rootfs = RESULTS / "python-base.tar"
    sources = [str(DEBIAN_SOURCES)] if DEBIAN_SOURCES.exists() else []
    started = time.monotonic()
    run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--include=" + ",".join(DEBIAN_PACKAGES),
            DEBIAN_SUITE,
            str(rootfs),
            *sources,
        ]
    )
    container = run(
        buildah(storage_driver, "from", "scratch"), capture_output=True, text=True
    ).stdout.strip()
    try:
        run(buildah(storage_driver, "add", container, str(rootfs), "/"), stdout=subprocess.DEVNULL)
        config = ["config", "--cmd", "python3"]
        for env in BASE_ENV:
            config += ["--env", env]
        run(buildah(storage_driver, *config, container))
        run(buildah(storage_driver, "commit", "--quiet", container, DEBIAN_BASE))
    finally:
        subprocess.run(buildah(storage_driver, "rm", container), capture_output=True)
        rootfs.unlink(missing_ok=True)
    record("base", DEBIAN_BASE, time.monotonic() - started, storage_driver)
    return DEBIAN_BASE


def machine_pip_settings() -> dict[str, str]:
    """This machine's pip settings (``pip config list``, then ``PIP_*`` variables on top)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.partition(".")
        if sep and section in ("global", "install") and name in PIP_KEYS:
            settings[name] = value.strip().strip("'\"")
    for name in PIP_KEYS:
        value = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if value:
            settings[name] = value
    if "timeout" not in settings and os.environ.get("PIP_DEFAULT_TIMEOUT"):
        settings["timeout"] = os.environ["PIP_DEFAULT_TIMEOUT"]
    return settings


def local_path(location: str) -> Path | None:
    """The local folder a find-links entry or index URL names, or None for a remote one."""
    if location.startswith("file://"):
        return Path(urlparse(location).path)
    if "://" not in location and location.startswith("/"):
        return Path(location)
    return None


def build_pip_config(
    settings: dict[str, str], folder: Path, find_links: bool
) -> tuple[Path, list[str]]:
    """Write ``folder/pip.conf`` for the build; return it and the ``--volume`` arguments.

    ``find_links=False`` leaves the find-links folders out (the gpu build: this machine's
    holds torch's CPU wheel, which would win over the CUDA build of the same version)."""
    folder.mkdir(parents=True, exist_ok=True)
    volumes: list[str] = []
    lines = ["[global]"]
    for key, value in settings.items():
        if key == "find-links" and not find_links:
            continue
        if key == "cert":
            shutil.copyfile(value, folder / "ca.pem")
            value = f"{BUILD_MOUNT}/ca.pem"
        for location in (
            value.split() if key in ("find-links", "extra-index-url", "index-url") else []
        ):
            path = local_path(location)
            if path is not None and path.exists():
                # a file:// index's pages link to files beside its simple/ folder
                mounted = path.parent if key != "find-links" and path.name == "simple" else path
                volumes += ["--volume", f"{mounted}:{mounted}:ro"]
        lines.append(f"{key} = {value}")
    conf = folder / "pip.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf, ["--volume", f"{folder}:{BUILD_MOUNT}:ro", *volumes]


def cpu_torch_spec(settings: dict[str, str], torch_version: str) -> str | None:
    """``torch==V+cpu`` when a find-links folder holds that wheel (no download.pytorch.org)."""
    for location in settings.get("find-links", "").split():
        path = local_path(location)
        if path is not None and any(path.glob(f"torch-{torch_version}+cpu-*.whl")):
            return f"torch=={torch_version}+cpu"
    return None


SIZE_UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def image_size(reference: str, storage_driver: str | None) -> int:
    """The image's size in bytes, uncompressed, as buildah states it (3 significant digits)."""
    listed = subprocess.run(
        buildah(storage_driver, "images", "--json", reference),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    number, unit = json.loads(listed)[0]["size"].split()
    return round(float(number) * SIZE_UNITS[unit])


def record(target: str, reference: str, seconds: float, storage_driver: str | None) -> dict:
    result = {
        "target": target,
        "image": reference,
        "seconds": round(seconds, 1),
        "size_bytes": image_size(reference, storage_driver),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host_cpu": host_cpu(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{target}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{target}: {reference}, {result['size_bytes'] / 1e6:.0f} MB, {seconds:.0f} s")
    return result


def host_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def build(args: argparse.Namespace) -> None:
    for tool in ("buildah", *(() if args.base else ("mmdebstrap",))):
        if shutil.which(tool) is None:
            sys.exit(f"images: {tool} is not installed (`make image-tools` installs it)")
    base = args.base or debian_base(args.storage_driver, rebuild=args.rebuild_base)
    settings = machine_pip_settings()
    for target in args.targets:
        conf_dir = RESULTS / f"pip-{target}"
        _, volumes = build_pip_config(settings, conf_dir, find_links=target != "gpu")
        build_args = {
            "PYTHON_BASE": base,
            "VERSION": project_version(),
            "PIP_CONFIG_FILE": f"{BUILD_MOUNT}/pip.conf",
        }
        if target == "cpu" and (spec := cpu_torch_spec(settings, args.torch_version)):
            build_args["TORCH_SPEC"] = spec
        reference = image_tag(target, args.repository)
        command = buildah(
            args.storage_driver,
            "bud",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--layers",
            "--format",
            "docker",
            "--target",
            target,
            "--tag",
            reference,
            *volumes,
        )
        for name, value in build_args.items():
            command += ["--build-arg", f"{name}={value}"]
        started = time.monotonic()
        run([*command, str(REPO)])
        record(target, reference, time.monotonic() - started, args.storage_driver)


def report(_: argparse.Namespace) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    if not rows:
        sys.exit("images: no build recorded yet (build/images/*.json)")
    print(f"{'target':<8} {'image':<40} {'size':>9} {'build':>8}  host")
    for row in rows:
        size = f"{row['size_bytes'] / 1e6:,.0f} MB"
        print(
            f"{row['target']:<8} {row['image']:<40} {size:>9} {row['seconds']:>7.0f}s"
            f"  {row['host_cpu']}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build Dockerfile targets with buildah")
    build_parser.add_argument("targets", nargs="+", choices=TARGETS)
    build_parser.add_argument(
        "--repository", default="localhost/llmrl", help="image name before the tag"
    )
    build_parser.add_argument(
        "--base", default="", help="PYTHON_BASE image; default: the Debian base made here"
    )
    build_parser.add_argument("--rebuild-base", action="store_true")
    build_parser.add_argument(
        "--storage-driver", default=None, help="buildah's storage driver (overlay, vfs)"
    )
    build_parser.add_argument("--torch-version", default="2.13.0")
    build_parser.set_defaults(run=build)
    commands.add_parser("report", help="sizes and times of the last builds").set_defaults(
        run=report
    )
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
