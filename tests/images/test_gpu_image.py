"""The gpu image without a GPU (``make image-gpu`` builds it, then runs this module).

What a machine without a GPU can show: the image runs as the chart's Ray and stage pods run it
(uid 10001, the stage pod's mounts), torch and vLLM 0.32 import together with llmrl (vLLM's CUDA
build: its platform reports no device here), the stage CLI answers, KubeRay's probes find bash
and wget, Triton's compiler (gcc) and Python's headers are there, and the container toolkit's
variables ask for a CUDA 13 driver. What only a GPU shows: vLLM starting an engine, NCCL weight
pushes and bf16 training in this image (``make test-gpu`` runs those on the GPU machine from
a bundle, not from this image: that machine has no container runtime).
"""

from __future__ import annotations

import pytest

from tests.images.image_checks import image, run_command

pytestmark = [pytest.mark.images, pytest.mark.gpu_image]


@pytest.fixture(scope="module")
def gpu_image() -> str:
    return image("gpu")


def test_gpu_image_imports_torch_vllm_and_llmrl(gpu_image, tmp_path) -> None:
    script = (
        "import importlib.metadata as m, torch, vllm, llmrl, triton;"
        "print(torch.__version__, m.version('vllm'), torch.version.cuda, torch.cuda.is_available())"
    )
    done = run_command(gpu_image, ["python", "-c", script], tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
    torch_version, vllm_version, cuda, available = done.stdout.split()[-4:]
    assert torch_version.startswith("2.13.0") and vllm_version == "0.32.0"
    assert cuda.startswith("13."), f"torch's CUDA is {cuda}; the chart's nodes need R580+"
    assert available == "False"


def test_gpu_image_answers_the_stage_cli_and_has_the_probes_tools(gpu_image, tmp_path) -> None:
    for argv in (["llmrl", "grpo", "--help"], ["llmrl", "sft", "--help"]):
        done = run_command(gpu_image, argv, tmp_path)
        assert done.returncode == 0 and "usage: llmrl" in done.stdout, done.stdout[-4000:]
    tools = "for tool in bash wget gcc bwrap; do command -v $tool || exit 1; done"
    done = run_command(gpu_image, ["/bin/sh", "-c", tools], tmp_path)
    assert done.returncode == 0, done.stdout
    assert len(done.stdout.split()) == 4
    headers = "import os, sysconfig; print(os.listdir(sysconfig.get_paths()['include']))"
    done = run_command(gpu_image, ["python", "-c", headers], tmp_path)
    assert "Python.h" in done.stdout, "Triton compiles its launchers against Python's headers"


def test_gpu_image_asks_the_container_toolkit_for_a_cuda_13_driver(gpu_image, tmp_path) -> None:
    done = run_command(gpu_image, ["/usr/bin/env"], tmp_path)
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
