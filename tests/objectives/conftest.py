"""Fixtures of the objective tests: a batch the tiny model sampled (2 responses to each of the
shared prompts), with advantages, and a per-test copy of it."""

from __future__ import annotations

import pytest
import torch

from llmrl.policies import TransformersWrapper
from tests.support.chats import history_batch


@pytest.fixture(scope="module")
def sampler(tiny, tokenizer):
    return TransformersWrapper(
        tiny, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 8, "seed": 0}
    )


@pytest.fixture(scope="module")
def sampled(sampler):
    """A collector-like batch [6]: ragged tokens, masks, sampling log-probs, advantages."""
    td = sampler(history_batch()).reshape(-1)
    td["advantage"] = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    return td


@pytest.fixture
def rollout(sampled, tiny):
    """A shallow copy of the sampled batch per test (tests may add entries)."""
    yield sampled.clone(False)
    tiny.zero_grad(set_to_none=True)
