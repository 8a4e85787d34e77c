"""The training stages by command name: their config class and the function that runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.config.sft import SFTConfig


def _sft(config: SFTConfig) -> Any:
    from llmrl.train.sft import run_sft

    return run_sft(config)


def _grpo(config: GRPOConfig) -> Any:
    from llmrl.train.grpo import run_grpo

    return run_grpo(config)


def _eval(config: EvalConfig) -> Any:
    from llmrl.train.evaluate import evaluate

    return evaluate(config)


STAGES: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "sft": (SFTConfig, _sft),
    "grpo": (GRPOConfig, _grpo),
    "eval": (EvalConfig, _eval),
}
