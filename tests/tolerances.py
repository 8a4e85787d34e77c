"""Tolerances derived from the arithmetic, for float comparisons in the tests.

A test that compares two float computations must allow what their rounding can legitimately
make them differ by on any CPU (matmul and reduction kernels block sums differently on AVX2
and AVX-512 builds, and with the thread count), and no more: a wrong index, chunk boundary or
dropped term moves a value by the order of the value itself, far above these bounds.

``eps`` below is ``torch.finfo(dtype).eps``, the spacing of floats at 1 (fp32: 2**-23 = 1.2e-7,
bf16: 2**-7 = 7.8e-3); rounding to nearest moves a value ``x`` by at most ``eps / 2 * |x|``.
"""

from __future__ import annotations

import math

import torch

SIGMAS = 6.0
"""Standard deviations a random-walk rounding error may reach. The max of N Gaussians is about
``sqrt(2 ln N)`` sigmas: 5.5 for the 3.1M elements of a 49152 x 64 embedding gradient, 5.7 for
10M; P(|Z| > 6) = 2e-9 per element. (The sigma of :func:`summation_atol` already overstates the
true one ~2x: a rounding error is uniform in +-eps/2, not +-eps, and most partial sums are below
the magnitude.)"""


def eps(dtype: torch.dtype = torch.float32) -> float:
    """``torch.finfo(dtype).eps``: the relative spacing of ``dtype``'s floats."""
    return torch.finfo(dtype).eps


def summation_atol(
    magnitude: float, terms: int, dtype: torch.dtype = torch.float32, sigmas: float = SIGMAS
) -> float:
    """How far two computations of the same sum of ``terms`` values of up to ``magnitude`` in
    ``dtype`` may differ when only their summation order (kernel blocking) differs.

    Each add rounds by up to ``eps/2 * |partial sum|`` (partial sums up to ``magnitude``); the
    roundings are independent and of either sign, so they accumulate like a random walk: one
    standard deviation is ``eps * sqrt(terms) * magnitude`` (both sides' errors, generously).
    Returns ``sigmas`` of those. For a chain of reductions pass the longest one: the errors of
    the shorter ones are smaller and add in quadrature.
    """
    return sigmas * eps(dtype) * math.sqrt(terms) * magnitude


def log_prob_atol(
    max_logit: float, vocab: int, dtype: torch.dtype = torch.float32, sigmas: float = SIGMAS
) -> float:
    """How far two computations of the same log-prob ``z_y - lse(z)`` (or entropy
    ``lse - sum_j p_j z_j``) over ``vocab`` logits of up to ``max_logit`` may differ in their
    summation order. The longest sums run over the vocabulary: ``sum_j exp(z_j - max z)``, terms
    up to 1 (its relative error is ``lse``'s absolute one), and ``sum_j p_j z_j``, partial sums
    up to ``max|z|``: ``summation_atol(1 + max|z|, vocab)``. The log-prob's own size (~log V)
    only adds single roundings."""
    return summation_atol(1 + max_logit, vocab, dtype, sigmas)


def rounding_atol(magnitude: float, dtype: torch.dtype, roundings: int = 1) -> float:
    """Worst-case bound for ``roundings`` roundings to ``dtype`` of values of up to
    ``magnitude``: each moves a value by at most ``eps/2 * magnitude`` (e.g. bf16: 2**-8 of
    it), and the moves add at worst in the same direction."""
    return roundings * eps(dtype) / 2 * magnitude


def sampling_atol(p: float, samples: int, sigmas: float = SIGMAS) -> float:
    """How far a frequency measured from ``samples`` independent draws may be from its
    probability ``p``: ``sigmas`` binomial standard deviations, ``sqrt(p (1 - p) / N)`` each."""
    return sigmas * math.sqrt(p * (1 - p) / samples)


def max_abs(tensor: torch.Tensor) -> float:
    """The largest ``|value|`` of ``tensor``: the magnitude a tolerance scales with."""
    return tensor.detach().abs().max().item()
