"""The training stages by command name: their config class and the function that runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmrl.config.common import StageConfig
from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.config.sft import SFTConfig


def _on_its_device(config: StageConfig, run: Callable[[Any], Any]) -> Any:
    """``run(config)``, after checking that ``model.device`` exists here (torch is loaded now)."""
    from llmrl.stages.common import require_device

    require_device(config.model.device)
    return run(config)


def _sft(config: SFTConfig) -> Any:
    from llmrl.stages.sft import run_sft

    return _on_its_device(config, run_sft)


def _grpo(config: GRPOConfig) -> Any:
    from llmrl.stages.grpo import run_grpo

    return _on_its_device(config, run_grpo)


def _eval(config: EvalConfig) -> Any:
    from llmrl.stages.evaluate import evaluate

    return _on_its_device(config, evaluate)


STAGES: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "sft": (SFTConfig, _sft),
    "grpo": (GRPOConfig, _grpo),
    "eval": (EvalConfig, _eval),
}
