"""Packed against padded scoring, checked the same way on the CPU (tests/policies/test_packing.py)
and on CUDA (tests/gpu/test_packing_gpu.py): GRPO-like rows, a weighted sum of every value whose
gradient reaches every parameter, and the tolerances of the two paths' sums."""

from __future__ import annotations

import torch

from tests.tolerances import log_prob_atol, max_abs, summation_atol

# GRPO-like rows: prompts of 3-8 tokens, responses from 1 token to the longest
LENGTHS = [9, 30, 4, 17, 12, 30, 6]
PROMPTS = [3, 5, 2, 8, 4, 6, 5]


def sequences_of(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (n,), generator=generator) for n in lengths]


def _weighted(result, generator) -> torch.Tensor:
    """A scalar of every value with random weights: its gradient reaches every parameter."""

    def weights(values: torch.Tensor) -> torch.Tensor:
        return torch.randn(values.shape, generator=generator).to(values.device)

    total = (result.log_probs * weights(result.log_probs)).sum()
    if result.entropy is not None:
        total = total + (result.entropy * weights(result.entropy)).sum()
    return total


def values_and_grads(model, score):
    result = score()
    _weighted(result, torch.Generator().manual_seed(1)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return result, grads


def max_logit(model, sequences) -> float:
    with torch.no_grad():
        device = next(model.parameters()).device
        return max(max_abs(model(input_ids=s[None].to(device)).logits) for s in sequences)


def assert_same_scores(model, packed, padded, sequences) -> None:
    """fp32 packed and padded scoring: the same values and gradients up to the order of their
    sums. Packing changes which positions share a matmul and how many keys a row's softmax runs
    over (masked keys add exact zeros); the longest sums on either path are the output layer's
    over the V vocabulary entries (forward: ``lse``, ``sum p z``; backward: ``grad_logits @ W``),
    so those bound the difference (see tests/policies/test_chunked_log_probs.py); the shorter
    ones (hidden 64, positions <= 30) add less, in quadrature. A position scored from the wrong
    context or the wrong place moves a log-prob by ~0.1-1."""
    (values, grads), (want, want_grads) = packed, padded
    vocab = model.config.vocab_size
    atol = log_prob_atol(max_logit(model, sequences), vocab)
    torch.testing.assert_close(values.log_probs, want.log_probs, atol=atol, rtol=0)
    if want.entropy is not None:
        torch.testing.assert_close(values.entropy, want.entropy, atol=atol, rtol=0)
    assert set(grads) == set(want_grads) and grads
    for name, grad in grads.items():
        bound = summation_atol(max_abs(want_grads[name]), vocab)
        torch.testing.assert_close(grad, want_grads[name], atol=bound, rtol=0, msg=name)


BF16_ROUNDINGS = 2 * 3  # two per layer boundary (2 decoder layers and the output layer)
"""How many bf16 roundings of a value's magnitude separate the two computations at most."""
