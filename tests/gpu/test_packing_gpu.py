"""Packed scoring on CUDA (llmrl/policies/packing.py): the probe passes on CUDA's attention
kernels, and packed rows give the padded rows' log-probs, entropies and gradients, to float32
reordering with TF32 off and to bf16 rounding in bfloat16 weights. The same checks as the CPU's
(tests/policies/test_packing.py, helpers in tests/support/packed_scoring.py)."""

from __future__ import annotations

import pytest
import torch

from llmrl.models import tiny_model
from llmrl.policies.packing import packing_problem, score_packed
from llmrl.policies.response_scoring import score_responses
from tests.gpu.conftest import requires_cuda
from tests.support.packed_scoring import (
    BF16_ROUNDINGS,
    PROMPTS,
    assert_same_scores,
    max_logit,
    sequences_of,
    values_and_grads,
)
from tests.tolerances import max_abs, rounding_atol

pytestmark = [pytest.mark.gpu, requires_cuda]

DEVICE = "cuda"


@pytest.fixture
def exact_fp32():
    """float32 matmuls in float32 (TF32 rounds their inputs to 10 bits)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _scores(model, sequences, chunk_size, entropy):
    head = {"log_prob_chunk_size": chunk_size, "with_entropy": entropy}
    packed = values_and_grads(
        model, lambda: score_packed(model, sequences, PROMPTS, 0, DEVICE, **head)
    )
    padded = values_and_grads(
        model,
        lambda: score_responses(model, sequences, PROMPTS, 0, DEVICE, share_prompts=False, **head),
    )
    return packed, padded


@pytest.mark.parametrize(("chunk_size", "entropy"), [(None, True), (5, False)])
def test_packed_rows_score_like_padded_rows_in_fp32(tokenizer, exact_fp32, chunk_size, entropy):
    model = tiny_model(tokenizer).to(DEVICE)
    assert packing_problem(model) is None  # the probe's forwards on CUDA's kernels
    sequences = sequences_of(model.config.vocab_size)
    packed, padded = _scores(model, sequences, chunk_size, entropy)
    assert packed[0].log_probs.device.type == DEVICE
    assert_same_scores(model, packed, padded, sequences)


def test_packed_rows_in_bfloat16_match_padded_rows_to_bfloat16_rounding(tokenizer):
    model = tiny_model(tokenizer, seed=9).to(DEVICE, torch.bfloat16)
    assert packing_problem(model) is None  # the probe in the weights' own precision
    sequences = sequences_of(model.config.vocab_size, seed=9)
    packed, padded = _scores(model, sequences, 64, False)
    # as on the CPU under autocast: BF16_ROUNDINGS roundings of max|z| bound a log-prob's move,
    # and of each gradient's magnitude bound its move (bf16 weights: the gradients are bf16)
    atol = rounding_atol(max_logit(model, sequences), torch.bfloat16, BF16_ROUNDINGS)
    torch.testing.assert_close(
        packed[0].log_probs.float(), padded[0].log_probs.float(), atol=atol, rtol=0
    )
    for name, grad in packed[1].items():
        want = padded[1][name].float()
        bound = rounding_atol(max_abs(want), torch.bfloat16, BF16_ROUNDINGS)
        torch.testing.assert_close(grad.float(), want, atol=bound, rtol=0, msg=name)
