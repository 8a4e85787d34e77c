"""scripts/images.py, the builder behind `make images`: the tags it gives are the ones the chart
and the Prefect work pool pull, and the machine's pip settings reach the build as one pip.conf
with its local folders mounted (no download from anywhere else; nothing of it in an image)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import images  # noqa: E402  (scripts/ is not a package)


def test_tags_are_the_ones_the_chart_and_the_work_pool_pull():
    values = yaml.safe_load((REPO / "helm" / "llmrl" / "values.yaml").read_text())
    chart = yaml.safe_load((REPO / "helm" / "llmrl" / "Chart.yaml").read_text())
    repository = values["image"]["repository"]
    # image.tag "" means the chart's appVersion
    assert images.image_tag("gpu", repository) == f"{repository}:{chart['appVersion']}"
    mlflow = values["mlflow"]["image"]
    assert images.image_tag("mlflow", repository) == f"{mlflow['repository']}:{mlflow['tag']}"
    template = json.loads((REPO / "k8s" / "prefect-work-pool-job-template.json").read_text())
    flow_default = template["variables"]["properties"]["image"]["default"]
    assert images.image_tag("flow", repository) == flow_default
    assert images.image_tag("cpu", "r/llmrl") == f"r/llmrl:{chart['appVersion']}-cpu"


def test_pip_settings_become_one_conf_with_local_folders_mounted(tmp_path):
    index = tmp_path / "pypi" / "simple"
    wheels = tmp_path / "wheels"
    index.mkdir(parents=True)
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    cert = tmp_path / "ca.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = {
        "index-url": "https://pypi.org/simple",
        "extra-index-url": f"file://{index} https://mirror.example/simple",
        "find-links": str(wheels),
        "cert": str(cert),
        "timeout": "180",
    }
    conf, volumes = images.build_pip_config(settings, tmp_path / "cpu", find_links=True)
    text = conf.read_text()
    assert f"find-links = {wheels}" in text
    assert f"cert = {images.BUILD_MOUNT}/ca.pem" in text  # the copy in the mount, not the host's
    assert (tmp_path / "cpu" / "ca.pem").read_text() == cert.read_text()
    mounts = [volumes[i + 1] for i in range(0, len(volumes), 2)]
    assert mounts == [
        f"{tmp_path / 'cpu'}:{images.BUILD_MOUNT}:ro",
        # a file:// index's pages link to ../../files: its parent is mounted
        f"{tmp_path / 'pypi'}:{tmp_path / 'pypi'}:ro",
        f"{wheels}:{wheels}:ro",
    ]
    assert images.cpu_torch_spec(settings, "2.13.0") == "torch==2.13.0+cpu"
    assert images.cpu_torch_spec(settings, "2.14.0") is None

    gpu_conf, gpu_volumes = images.build_pip_config(settings, tmp_path / "gpu", find_links=False)
    assert "find-links" not in gpu_conf.read_text()  # its CPU torch would win over CUDA's
    assert f"{wheels}:{wheels}:ro" not in gpu_volumes


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("file:///opt/pypi/simple", Path("/opt/pypi/simple")),
        ("/opt/wheels", Path("/opt/wheels")),
        ("https://pypi.org/simple", None),
        ("wheels", None),
    ],
)
def test_only_local_locations_are_mounted(location, expected):
    assert images.local_path(location) == expected
