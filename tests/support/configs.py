"""Stage configs as the CLI builds them, and a hostile YAML config."""

from __future__ import annotations

import json
from typing import Any


def stage_config(config_cls: type, *overrides: str, **fields: Any) -> Any:
    """A stage config as the CLI builds it: ``--set``-style ``overrides`` (``"a.b=1"``) and
    keyword ``fields`` (top-level values, e.g. ``steps=3``) on top of the defaults."""
    from llmrl.config import load_config

    return load_config(config_cls, None, _sets(overrides, fields))


def _sets(overrides: tuple[str, ...], fields: dict[str, Any]) -> list[str]:
    """``--set`` strings: ``progress=false``, the ``overrides``, then the ``fields`` as JSON."""
    return [
        "progress=false",
        *overrides,
        *(f"{key}={json.dumps(value)}" for key, value in fields.items()),
    ]


BOMB = "generate:\n  options:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    {n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
"""Billion laughs: nine levels of nine aliases each, 9**9 (387 million) strings once expanded."""


def tiny_grpo_config(data: Any, model: Any, *overrides: str, **fields: Any) -> Any:
    """A GRPO config for the runtime tests: the tiny model on ``data``, 2 prompts x 2 samples
    of 6 tokens, one torch thread per actor, lr 1e-4; ``overrides`` and ``fields`` on top."""
    from llmrl.config.grpo import GRPOConfig

    return stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model}",
        "generation.max_new_tokens=6",
        "optimizer.lr=1e-4",
        "runtime.torch_threads=1",
        *overrides,
        **{"prompts_per_step": 2, "num_samples": 2, **fields},
    )


def vllm_cpu_grpo_config(data: Any, model: Any, *overrides: str, **fields: Any) -> Any:
    """``configs/grpo-vllm-cpu.yaml`` (the GRPO runtime on a vLLM CPU engine, 2 env workers,
    2 DDP trainer ranks) on ``data`` with ``model``; ``overrides`` and ``fields`` on top."""
    from llmrl.config import load_config
    from llmrl.config.grpo import GRPOConfig
    from tests.support.paths import REPO

    sets = _sets((f"data.path={data}", f"model.name={model}", *overrides), fields)
    return load_config(GRPOConfig, REPO / "configs" / "grpo-vllm-cpu.yaml", sets)
