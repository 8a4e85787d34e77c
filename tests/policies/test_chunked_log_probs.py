"""Chunked log-probs and entropy (llmrl/policies/chunked_log_probs.py): the same values and
gradients as full logits, through scoring paths, without the full logits ever existing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from llmrl.data import Tokens
from llmrl.objectives.token_level import token_entropy
from llmrl.policies import TransformersWrapper
from llmrl.policies.chunked_log_probs import chunked_log_probs, forward_log_probs, log_prob_head
from llmrl.policies.response_scoring import score_responses
from tests.tolerances import log_prob_atol, max_abs, rounding_atol, summation_atol

ROWS, HIDDEN, VOCAB = 23, 16, 257


def _inputs(dtype=torch.float32, bias=True, rows=ROWS, hidden=HIDDEN, vocab=VOCAB):
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(rows, hidden, generator=generator, dtype=dtype)
    weight = torch.randn(vocab, hidden, generator=generator, dtype=dtype) / 2
    b = torch.randn(vocab, generator=generator, dtype=dtype) if bias else None
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    grads = torch.randn(2, rows, generator=generator)  # upstream gradients of (log-prob, entropy)
    leaves = [t.requires_grad_() for t in (h, weight, b) if t is not None]
    return leaves, targets, grads


def _max_logit(leaves):
    with torch.no_grad():
        return F.linear(*leaves).abs().max().item()


def _reference(hidden, weight, bias, targets):
    """Full logits, then log-softmax and ``-sum p log p``: what chunking must reproduce."""
    log_p = F.linear(hidden, weight, bias).float().log_softmax(-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def _values_and_grads(fn, leaves, grads):
    log_probs, entropy = fn()
    value = (log_probs * grads[0]).sum() + (entropy * grads[1]).sum()
    return [log_probs, entropy], torch.autograd.grad(value, leaves)


def _assert_close(got, want, atol):
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def _assert_scoring_matches(model, got, want, max_logit):
    """Chunked and full-logits fp32 scoring of ``model``: the same values and gradients up to
    the order of their sums. The longest reduction on either path runs over the V vocabulary
    entries: ``lse`` and ``sum_j p_j z_j`` in forward (terms up to 1 and ``max|z|``: magnitude
    ``1 + max|z|``; log-probs and entropies of ~log V add single roundings), and in backward
    ``grad_hidden = grad_logits @ W``, through which every parameter's gradient flows (each
    tensor at its own magnitude). Shorter sums (hidden, positions) add less, in quadrature.
    A wrong chunk boundary or a dropped position moves a log-prob by ~0.1-1 and a gradient by
    the order of its entries, far above these bounds (tiny: 3e-4; 1.6e-4 of each gradient's
    max)."""
    vocab = model.config.vocab_size
    (values, grads), (want_values, want_grads) = got, want
    _assert_close(values, want_values, atol=log_prob_atol(max_logit, vocab))
    for a, b in zip(grads, want_grads, strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=summation_atol(max_abs(b), vocab), rtol=0)


def test_backward_formula_is_the_exact_gradient():
    """float64 gradcheck of the chunked backward (grad_logits = g_lp (onehot - p)
    - g_H p (log p + H)), for log-probs and entropy together and apart."""
    # 9 positions in chunks of 4: three chunks, the last partial
    leaves, targets, _ = _inputs(torch.float64, rows=9, hidden=4, vocab=11)

    def both(*args):
        return chunked_log_probs(*args, targets, 4, with_entropy=True)

    assert torch.autograd.gradcheck(both, leaves)
    assert torch.autograd.gradcheck(lambda *a: both(*a)[1], leaves)
    assert torch.autograd.gradcheck(lambda *a: chunked_log_probs(*a, targets, 4)[0], leaves)


@pytest.mark.parametrize("chunk_size", [1, 5, 7, 22, 23, 64])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_chunks_match_full_logits_in_fp32(chunk_size, bias):
    """Same values and gradients (hidden, weight, bias) as full logits, for chunk sizes that do
    and do not divide the 23 positions (and one chunk: plain autograd)."""
    leaves, targets, grads = _inputs(bias=bias)
    weight_bias = leaves[1:] + ([None] if not bias else [])
    got = _values_and_grads(
        lambda: chunked_log_probs(leaves[0], *weight_bias, targets, chunk_size, True),
        leaves,
        grads,
    )
    want = _values_and_grads(lambda: _reference(leaves[0], *weight_bias, targets), leaves, grads)
    # Both sides do the same fp32 arithmetic in another order (a chunk's matmul, logsumexp vs
    # log_softmax, lse - sum p z vs -sum p log p, weight gradients summed chunk by chunk):
    # rounding errors of eps (1.2e-7) times values of magnitude |logit| + log V, accumulated
    # like a random walk over sums of up to V = 257 terms: ~3e-5 here (~5e-6 is observed).
    magnitude = _max_logit([leaves[0], *weight_bias]) + math.log(VOCAB)
    atol = torch.finfo(torch.float32).eps * math.sqrt(VOCAB) * magnitude
    _assert_close(got[0], want[0], atol)
    _assert_close(got[1], want[1], atol)


@pytest.mark.parametrize("chunk_size", [6, 64])
def test_chunks_match_plain_autocast_in_bf16(chunk_size):
    """Under CPU autocast the chunks compute logits in bf16 like ``nn.Linear`` would, and give
    the plain autocast computation's values and gradients to bf16 rounding."""
    leaves, targets, grads = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _values_and_grads(
            lambda: chunked_log_probs(leaves[0], *leaves[1:], targets, chunk_size, True),
            leaves,
            grads,
        )
        want = _values_and_grads(lambda: _reference(leaves[0], *leaves[1:], targets), leaves, grads)
    # bf16 rounds to 8 significant bits (relative error <= 2**-8). A logit may round the other
    # way when its matmul is blocked differently, moving a log-prob (z_y - lse) by at most two
    # roundings of the largest logit. The weight gradient is summed from per-chunk bf16
    # products, each rounded once (2**-8 of at most the total's magnitude), against one
    # rounded product: (chunks + 1) roundings.
    _assert_close(got[0], want[0], atol=rounding_atol(_max_logit(leaves), torch.bfloat16, 2))
    chunks = math.ceil(ROWS / chunk_size)
    for a, b in zip(got[1], want[1], strict=True):
        atol = rounding_atol(max_abs(b), torch.bfloat16, chunks + 1)
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def _grads(model):
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def _score_and_backward(model, fn):
    """Log-probs and entropies of a scoring call, and the parameter gradients of a weighted
    sum of both (random weights: every position's gradient counts)."""
    log_probs, entropy = fn()
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(2, *log_probs.shape, generator=generator)
    ((log_probs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    return [log_probs.detach(), entropy.detach()], _grads(model)


def _max_logit_of(model, rows):
    """``max|z|`` over the logits of ``rows`` (right-padded: the rows' own logits unchanged)."""
    with torch.no_grad():
        input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        return max_abs(model(input_ids=input_ids).logits)


ROWS_AND_PROMPTS = (
    [torch.tensor([5, 6, 7, 1, 2]), torch.tensor([5, 6, 7, 3]), torch.tensor([8, 9, 4, 4, 4])],
    [3, 3, 2],
)


@pytest.mark.parametrize("share_prompts", [True, False], ids=["shared-prompts", "one-pass"])
def test_score_responses_chunked_equals_full_logits(tiny, share_prompts, monkeypatch):
    from llmrl.policies import response_scoring

    calls = []
    original = response_scoring._shared_prompts
    monkeypatch.setattr(
        response_scoring, "_shared_prompts", lambda *a: calls.append(1) or original(*a)
    )
    rows, prompt_lengths = ROWS_AND_PROMPTS
    results = []
    for chunk_size in (2, None):

        def score(chunk_size=chunk_size):
            out = score_responses(
                tiny,
                rows,
                prompt_lengths,
                0,
                "cpu",
                log_prob_chunk_size=chunk_size,
                with_entropy=True,
                share_prompts=share_prompts,
            )
            return out.log_probs, out.entropy

        results.append(_score_and_backward(tiny, score))
    assert len(calls) == (2 if share_prompts else 0)
    _assert_scoring_matches(tiny, *results, _max_logit_of(tiny, rows))
    values = results[0][0]
    assert (values[1][0, :3] == 0).all() and (values[1][0, 3:] > 0).all()


@pytest.mark.parametrize("responses_only", [False, True], ids=["full-path", "responses-only"])
def test_wrapper_scoring_chunked_equals_full_logits(tiny, tokenizer, responses_only):
    """TransformersWrapper scoring with small chunks gives log-probs, entropies and gradients
    of the full-logits path; the entropy is that of the full logits (``token_entropy``)."""
    rows, prompt_lengths = ROWS_AND_PROMPTS
    tokens = Tokens.from_sequences(
        prompt=[r[:n] for r, n in zip(rows, prompt_lengths, strict=True)],
        response=[r[n:] for r, n in zip(rows, prompt_lengths, strict=True)],
    )
    td = TensorDict({"tokens": tokens}, batch_size=[3])
    scorer = TransformersWrapper(
        tiny,
        tokenizer,
        generate=False,
        input_mode="tokens",
        pad_output=True,
        return_entropy=True,
        score_responses_only=responses_only,
        log_prob_chunk_size=3,
    )
    results = []
    for policy in (scorer, scorer.get_new_version(log_prob_chunk_size=None)):

        def score(policy=policy):
            out = policy(td)
            return out["log_probs"].full, out["entropy"].full

        results.append(_score_and_backward(tiny, score))
    assert scorer.log_prob_chunk_size == 3
    _assert_scoring_matches(tiny, *results, _max_logit_of(tiny, rows))
    values = results[0][0]

    with torch.no_grad():
        out = scorer.get_new_version(return_logits=True, score_responses_only=False)(td)
    masks = out["masks"]
    right_padded = token_entropy(out["logits"])
    # -sum_j p_j log p_j: a V-term sum whose partial sums grow to the entropy (~log V), against
    # lse - sum_j p_j z_j. An entropy in a prompt or padding slot (0) would be off by ~log V.
    atol = summation_atol(max_abs(right_padded), tiny.config.vocab_size)
    for row, length in enumerate(masks.full.sum(1).tolist()):
        want = right_padded[row, :length]
        if responses_only:
            want = torch.where(torch.arange(length) < prompt_lengths[row], 0.0, want)
        torch.testing.assert_close(values[1][row][masks.full[row]], want, atol=atol, rtol=0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor (elements) any op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.numel())
        return out


def test_full_logits_never_exist_in_forward_or_backward():
    """With vocabulary 8192 the [rows, positions, vocab] logits dwarf every other tensor;
    chunked scoring never creates a tensor larger than V x max(chunk, H) (a chunk's logits, or
    the [V, H] output-layer weight and its gradient), in forward or backward, while the plain
    path creates the full logits (so this check can fail)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden, chunk_size = 8192, 32, 24
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    rows, length = 4, 32
    input_ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    targets = F.pad(input_ids[:, 1:], (0, 1))
    largest = {}
    for size in (chunk_size, None):
        forward, backward = _LargestTensor(), _LargestTensor()
        with forward:
            log_probs, entropy = forward_log_probs(
                model, targets, chunk_size=size, with_entropy=True, input_ids=input_ids
            )
            loss = log_probs.sum() + entropy.sum()
        with backward:
            loss.backward()
        assert backward.ops > 0  # the mode sees the backward's ops
        largest[size] = (forward.largest, backward.largest)
    bound = vocab * max(chunk_size, hidden)
    assert max(largest[chunk_size]) <= bound
    assert min(largest[None]) >= rows * length * vocab  # 4x the bound: the check can fail


def test_head_is_restored_and_checks_positions(tiny):
    head = tiny.get_output_embeddings()
    input_ids = torch.tensor([[5, 6, 7, 8]])
    head_for_4 = log_prob_head(tiny, torch.zeros(1, 4, dtype=torch.long), chunk_size=2)
    with pytest.raises(ValueError, match="logits_to_keep"), torch.no_grad(), head_for_4:
        tiny(input_ids=input_ids, logits_to_keep=2)
    assert "forward" not in head.__dict__
    with torch.no_grad():
        assert tiny(input_ids=input_ids).logits.shape == (1, 4, tiny.config.vocab_size)
