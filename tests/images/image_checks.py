"""The images under test (``make images``, ``make image-gpu``) and a one-off command in one of
them as a stage pod runs (the launcher's security contexts, no mounts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.launchers.settings import CONTAINER_SECURITY_CONTEXT, POD_SECURITY_CONTEXT
from tests.support.image_pods import ImageRoot, PodContainer, run_in_image
from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "scripts"))
import images as image_builds

REPOSITORY = os.environ.get("LLMRL_IMAGE_REPOSITORY", "localhost/llmrl")
"""Where ``make images`` tagged them (its IMAGE_REPOSITORY)."""


def image(target: str) -> str:
    """The built image of a Dockerfile target; fails (never skips) when it is not built."""
    reference = image_builds.image_tag(target, REPOSITORY)
    if shutil.which("buildah") is None or not image_builds.image_exists(reference, None):
        make = "make image-gpu" if target == "gpu" else "make images"
        pytest.fail(f"image {reference} is not built: run `{make}`")
    return reference


def run_command(
    reference: str, argv: list[str], scratch: Path, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``argv`` in ``reference`` as a stage pod's container runs (uid 10001, no capabilities)."""
    container = {"name": "check", "securityContext": dict(CONTAINER_SECURITY_CONTEXT)}
    spec = PodContainer(container, {"securityContext": dict(POD_SECURITY_CONTEXT)}, argv=argv)
    with ImageRoot(reference) as root:
        return run_in_image(spec, root, scratch, timeout=timeout)
