"""Chunked log-probs on CUDA (llmrl/policies/chunked_log_probs.py): the same values and
gradients as full logits, and a peak memory bounded by the chunk size, not by the positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmrl.policies.chunked_log_probs import (
    chunked_log_probs,
    forward_log_probs,
    log_probs_from_logits,
)
from tests.gpu.conftest import requires_cuda
from tests.tolerances import log_prob_atol, max_abs, summation_atol

pytestmark = [pytest.mark.gpu, requires_cuda]

QWEN_VOCAB = 151_936  # Qwen2.5's vocabulary: where full logits hurt most
MIB = 2**20


def _inputs(rows: int, hidden: int, vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=generator).cuda().requires_grad_()
    w = (torch.randn(vocab, hidden, generator=generator) * 0.05).cuda().requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=generator).cuda()
    return h, w, targets


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunks_match_full_logits_and_their_gradients_in_fp32(with_entropy):
    h, w, targets = _inputs(rows=600, hidden=64, vocab=5000)
    weights = torch.rand(600, device="cuda")  # a loss that weighs positions differently
    grads, values = [], []
    for chunk_size in (128, None):
        h.grad = w.grad = None
        if chunk_size is None:
            log_probs, entropy = log_probs_from_logits(h @ w.T, targets, with_entropy)
        else:
            log_probs, entropy = chunked_log_probs(h, w, None, targets, chunk_size, with_entropy)
        loss = (log_probs * weights).sum() + (entropy.sum() if with_entropy else 0.0)
        loss.backward()
        values.append((log_probs.detach(), None if entropy is None else entropy.detach()))
        grads.append((h.grad.clone(), w.grad.clone()))
    # fp32 (no TF32) in another order: the longest sums run over the 5000 logits of a position
    # (log_prob_atol for values; grad_hidden = grad_logits @ w for gradients, and each
    # gradient tensor at its own magnitude), as in tests/policies/test_chunked_log_probs.py
    with torch.no_grad():
        atol = log_prob_atol(max_abs(h @ w.T), 5000)
    torch.testing.assert_close(values[0][0], values[1][0], atol=atol, rtol=0)
    if with_entropy:
        torch.testing.assert_close(values[0][1], values[1][1], atol=atol, rtol=0)
    for chunked, full in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(chunked, full, atol=summation_atol(max_abs(full), 5000), rtol=0)


def test_model_scoring_chunked_matches_full_logits_with_gradients(tokenizer):
    from llmrl.models import tiny_model

    model = tiny_model(tokenizer, seed=1).cuda()
    ids = torch.randint(0, len(tokenizer), (3, 40), generator=torch.Generator().manual_seed(1))
    ids = ids.cuda()
    targets = F.pad(ids[:, 1:], (0, 1))
    results = []
    for chunk_size in (32, None):
        model.zero_grad(set_to_none=True)
        log_probs, entropy = forward_log_probs(
            model, targets, chunk_size=chunk_size, with_entropy=True, input_ids=ids
        )
        (log_probs.sum() + 0.1 * entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((log_probs.detach(), entropy.detach(), grads))
    (lp_c, ent_c, grads_c), (lp_f, ent_f, grads_f) = results
    # the same sums in another order, the longest over the vocabulary (see above)
    vocab = model.config.vocab_size
    with torch.no_grad():
        atol = log_prob_atol(max_abs(model(input_ids=ids).logits), vocab)
    torch.testing.assert_close(lp_c, lp_f, atol=atol, rtol=0)
    torch.testing.assert_close(ent_c, ent_f, atol=atol, rtol=0)
    assert grads_c.keys() == grads_f.keys()
    for name, full in grads_f.items():
        atol = summation_atol(max_abs(full), vocab)
        torch.testing.assert_close(grads_c[name], full, atol=atol, rtol=0)


def _peak_above_start(chunk_size: int | None, rows: int, hidden: int) -> tuple[int, int]:
    """(peak bytes allocated above what was live before, the weight's bytes) of one forward and
    backward of the log-probs of ``rows`` positions over Qwen's vocabulary."""
    h, w, targets = _inputs(rows, hidden, QWEN_VOCAB)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if chunk_size is None:
        log_probs, _ = log_probs_from_logits(h @ w.T, targets)
    else:
        log_probs, _ = chunked_log_probs(h, w, None, targets, chunk_size)
    log_probs.sum().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start, w.numel() * w.element_size()


def test_peak_memory_of_forward_and_backward_is_bounded_by_the_chunk():
    rows, hidden, chunk = 4096, 256, 256
    chunked, weight_bytes = _peak_above_start(chunk, rows, hidden)
    full, _ = _peak_above_start(None, rows, hidden)
    buffer = chunk * QWEN_VOCAB * 4  # one chunk's fp32 [chunk, vocab] values: 148 MiB
    # Above what was live: the weight's gradient and the backward's fp32 accumulator (2 weight
    # sizes; one when they coincide in fp32), the [rows, hidden] gradient and per-position
    # values (a few MiB), and at most 5 chunk buffers at once (backward: logits - lse, p,
    # the gradient of the logits, p * g, plus one matmul temporary), 64 MiB slack
    bound = 2 * weight_bytes + 5 * buffer + 64 * MIB
    assert chunked <= bound, f"chunked peak {chunked / MIB:.0f} MiB > bound {bound / MIB:.0f} MiB"
    # full logits: [4096, 151936] fp32 is 2.3 GiB alone (and its softmax again), above the bound
    assert full > bound + rows * QWEN_VOCAB * 4 // 2, f"full peak {full / MIB:.0f} MiB"
