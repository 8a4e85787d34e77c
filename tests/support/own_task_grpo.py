"""One GRPO step of the in-process loop (``InProcessGRPO``: the stage's own step, in one
process) on the tiny model over a task prepared from a prepare config: how the tests show that
a user's task or an ecosystem adapter trains, not only that its episodes run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prepared(output_dir: Path, **prepare: Any) -> Path:
    """The folder ``llmrl prepare`` makes from a config of ``prepare``'s fields."""
    from llmrl.config.prepare import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    return prepare_dataset(PrepareConfig(output_dir=output_dir, **prepare), progress=False).path


def grpo_step(data: Path, model_dir: Path, *overrides: str) -> tuple[Any, dict[str, Any]]:
    """The batch and metrics of step 1 of GRPO on ``data`` (2 prompts x 2 samples of 6
    tokens; ``overrides`` on top), with every group trained on (no zero-std drop)."""
    from llmrl.runtime.grpo_loop import InProcessGRPO
    from tests.support.configs import tiny_grpo_config

    config = tiny_grpo_config(
        data, model_dir, "steps=1", "advantage.drop_zero_std=false", *overrides
    )
    return InProcessGRPO(config).step(1)
