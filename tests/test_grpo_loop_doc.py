"""The script of docs/grpo-loop.md runs as written and trains: its code block, executed with the
tests' tiny random model and two steps, ends with finite rewards and losses, two optimizer
steps taken and weights that moved."""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from llmrl.envs.tasks.base import Score
from tests.support.doc_pages import python_block

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "grpo-loop.md"


def page_script() -> str:
    """The page's one Python block."""
    return python_block("docs/grpo-loop.md")


def with_constant(script: str, name: str, value: str) -> str:
    """``script`` with its top-level ``NAME = ...`` line set to ``value``."""
    script, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", script, flags=re.M)
    assert count == 1, f"the page's script should set {name} once"
    return script


@dataclass(frozen=True)
class AnswerHashTask:
    """The prepared task's name and instructions, but a reward that differs between any two
    answers (a hash of the text): the random tiny model never answers right, and a group whose
    rewards are all equal has nothing to learn from."""

    name: str
    instructions: str

    def score(self, response: str, problem_answer: str) -> Score:
        reward = zlib.crc32(response.encode()) / 2**32
        return Score(reward=reward, correct=False, formatted=False, parsed=None)


def test_the_pages_script_trains_the_tiny_model(tiny, tokenizer, tmp_path, monkeypatch):
    from llmrl.runtime import grpo_loop

    model_dir = tmp_path / "tiny-model"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prepared = grpo_loop.prepared_task

    def hashed(path):
        task, manifest = prepared(path)
        return AnswerHashTask(task.name, task.instructions), manifest

    monkeypatch.setattr(grpo_loop, "prepared_task", hashed)
    monkeypatch.chdir(tmp_path)
    script = with_constant(page_script(), "MODEL", repr(str(model_dir)))
    script = with_constant(script, "STEPS", "2")
    script = with_constant(script, "CONFIGS", repr(str(REPO / "configs")))

    namespace: dict = {"__name__": "grpo_loop_doc"}
    exec(compile(script, str(PAGE), "exec"), namespace)

    metrics, grpo = namespace["metrics"], namespace["grpo"]
    assert metrics["policy_version"] == 2  # two optimizer steps, each pushed
    assert math.isfinite(metrics["reward_mean"]) and math.isfinite(metrics["loss"])
    assert metrics["trained_groups"] == grpo.config.prompts_per_step  # every group had a signal
    before = tiny.state_dict()
    moved = [
        name
        for name, weight in grpo.model.state_dict().items()
        if not torch.equal(weight, before[name])
    ]
    assert moved, "no weight changed in two GRPO steps"
    assert (tmp_path / "runs" / "my-grpo" / "config.json").is_file()


@pytest.mark.parametrize("name", ["MODEL", "STEPS", "CONFIGS"])
def test_the_pages_script_sets_what_the_test_replaces(name):
    assert re.search(rf"^{name} = ", page_script(), flags=re.M)
