"""Picklable env and policy factories for the Ray tests, and a weight perturbation.

Kept apart from the test modules (and from ``tests/conftest.py``, which makes a fresh cache
folder when imported): Ray actors import this module to rebuild the factories.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmrl.envs import ArithmeticEnv
from llmrl.models import load_tokenizer, tiny_model
from llmrl.policies import TransformersWrapper


@dataclass(frozen=True)
class ArithmeticEnvFactory:
    """``ArithmeticEnv``s whose problem order depends on the worker index."""

    batch_size: int = 2
    repeats: int = 2
    num_problems: int = 10

    def __call__(self, worker_index: int) -> ArithmeticEnv:
        return ArithmeticEnv(
            batch_size=self.batch_size,
            repeats=self.repeats,
            num_problems=self.num_problems,
            seed=worker_index,
        )


@dataclass(frozen=True)
class TinyPolicyFactory:
    """A TransformersWrapper over ``tiny_model(seed=seed)`` that batches concurrent callers."""

    seed: int = 0
    max_new_tokens: int = 4
    min_batch_size: int = 2

    def __call__(self) -> TransformersWrapper:
        tokenizer = load_tokenizer()
        return TransformersWrapper(
            tiny_model(tokenizer, seed=self.seed),
            tokenizer,
            generate_kwargs={"max_new_tokens": self.max_new_tokens},
            min_batch_size=self.min_batch_size,
            max_batch_size=32,
            batching_timeout=1.0,
        )


def perturbed(model: torch.nn.Module, seed: int = 7) -> torch.nn.Module:
    """The model with every parameter moved by noise (a stand-in for an optimizer step)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model
