"""The loop of docs/grpo-loop-torchrl.md runs as written and trains: its code block ends with a
finite loss, three optimizer steps taken and pushed (policy version 3), the trained model's
weights moved, and the sampling engine holding exactly those weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import llmrl
from tests.support.doc_pages import python_block

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "grpo-loop-torchrl.md"


def page_script() -> str:
    """The page's one Python block."""
    return python_block("docs/grpo-loop-torchrl.md")


# the session's tokenizer: the page's load_tokenizer then finds SmolLM2's GGUF converted already
@pytest.mark.usefixtures("tokenizer")
def test_the_pages_loop_trains_and_pushes_the_weights(monkeypatch, capsys):
    built = {}

    def recorded_tiny_model(*args, **kwargs):
        model = tiny_model(*args, **kwargs)
        built["before"] = {name: value.clone() for name, value in model.state_dict().items()}
        return model

    tiny_model = llmrl.tiny_model
    monkeypatch.setattr(llmrl, "tiny_model", recorded_tiny_model)  # what `from llmrl import` gets

    namespace: dict = {"__name__": "grpo_loop_torchrl_doc"}
    exec(compile(page_script(), str(PAGE), "exec"), namespace)

    steps = namespace["STEPS"]
    assert namespace["sync"].version == steps == namespace["collector"].policy_version
    assert math.isfinite(namespace["loss"].item())
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == [
        f"policy version {n}" for n in range(1, steps + 1)
    ]
    model, engine = namespace["model"], namespace["engine"]
    assert engine is not model
    after = model.state_dict()
    moved = [name for name, value in built["before"].items() if not torch.equal(value, after[name])]
    assert moved, f"no weight changed in {steps} GRPO steps"
    held = engine.state_dict()
    assert all(torch.equal(held[name], after[name]) for name in after), "the engine is stale"
