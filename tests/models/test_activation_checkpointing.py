"""Activation checkpointing (llmrl/models/activation_checkpointing.py): the same gradients,
fewer tensors kept for backward, KV-cache passes left alone."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from llmrl.models import tiny_model
from llmrl.models.activation_checkpointing import (
    enable_activation_checkpointing,
    uses_activation_checkpointing,
)
from tests.tolerances import max_abs, summation_atol


def _gradients_and_saved_bytes(model: torch.nn.Module, tokens: torch.Tensor):
    """Parameter gradients of a loss on the decoder's output for ``tokens`` (no output layer:
    its logits would dwarf a tiny model's activations), and the bytes autograd kept for
    backward during the forward (counted as they are packed)."""
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        hidden = model.model(input_ids=tokens, use_cache=False).last_hidden_state
    hidden.square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, saved[0]


def test_checkpointed_layers_give_the_same_gradients_and_keep_less(tokenizer):
    tokens = torch.randint(0, 2000, (2, 48), generator=torch.Generator().manual_seed(0))
    plain = tiny_model(tokenizer, num_layers=3, seed=1)
    expected, plain_bytes = _gradients_and_saved_bytes(plain, tokens)

    checkpointed = enable_activation_checkpointing(tiny_model(tokenizer, num_layers=3, seed=1))
    assert uses_activation_checkpointing(checkpointed) and not uses_activation_checkpointing(plain)
    assert not checkpointed.training  # works in eval mode (transformers' switch needs train())
    grads, checkpointed_bytes = _gradients_and_saved_bytes(checkpointed, tokens)

    for name, grad in expected.items():
        # the recomputation repeats the same CPU kernels on the same inputs: bitwise equal
        assert torch.equal(grads[name], grad), name
    # each layer now keeps its input alone instead of its attention and MLP intermediates
    assert checkpointed_bytes < 0.6 * plain_bytes, (checkpointed_bytes, plain_bytes)
    # the names the optimizer, checkpoints and weight pushes use are unchanged
    assert [n for n, _ in checkpointed.named_parameters()] == list(expected)


def test_enabling_twice_wraps_once(tokenizer):
    model = tiny_model(tokenizer, num_layers=1)
    enable_activation_checkpointing(model)
    forward = model.model.layers[0].forward
    enable_activation_checkpointing(model)
    assert model.model.layers[0].forward is forward


def test_a_pass_that_writes_a_kv_cache_is_not_recomputed(tokenizer):
    # recomputing it would append the keys and values a second time
    model = enable_activation_checkpointing(tiny_model(tokenizer, num_layers=2, seed=2))
    reference = tiny_model(tokenizer, num_layers=2, seed=2)
    prefix = torch.tensor([[5, 6, 7, 8]])
    suffix = torch.tensor([[9, 10, 11]])
    grads = []
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
        cache = DynamicCache()
        m(input_ids=prefix, past_key_values=cache, use_cache=True)
        logits = m(input_ids=suffix, past_key_values=cache, use_cache=True).logits
        logits.float().logsumexp(-1).sum().backward()
        assert cache.get_seq_length() == 7  # prefix + suffix, once each
        grads.append({n: p.grad for n, p in m.named_parameters()})
    for name, grad in grads[1].items():
        assert torch.equal(grads[0][name], grad), name


def test_scoring_shared_prompts_under_checkpointing_matches_the_plain_model(tokenizer):
    # G responses per prompt: the plain model scores the prompt once through a KV cache; the
    # checkpointed one must take one pass instead (a cache pass cannot be recomputed)
    from llmrl.policies import TransformersWrapper

    prompt = torch.tensor([3, 4, 5, 6, 7])
    sequences = [torch.cat([prompt, torch.tensor(r)]) for r in ([8, 9], [10, 11, 12], [13])]
    results = []
    for checkpointed in (False, True):
        model = tiny_model(tokenizer, num_layers=2, seed=4)
        if checkpointed:
            enable_activation_checkpointing(model)
        scorer = TransformersWrapper(model, tokenizer, generate=False, log_prob_chunk_size=None)
        log_probs = scorer._score(sequences, prompt_lengths=[5, 5, 5]).log_probs
        log_probs.sum().backward()
        results.append((log_probs.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (plain, plain_grads), (checked, checked_grads) = results
    # the two paths compute the same sums in another grouping: float32 rounding apart. The
    # longest sums run over the vocabulary: lse (terms up to 1, plus z_y: magnitude
    # 1 + max|z|) and grad_hidden = grad_logits @ W, through which every gradient flows (each
    # tensor at its own magnitude). Measured 4.8e-7 (embedding, max 3.6; bound 5.7e-4) on EPYC
    # AVX-512, 2026-11-27; a prompt scored twice or not at all would move values by O(1).
    vocab = model.config.vocab_size
    with torch.no_grad():
        max_logit = max(max_abs(model(input_ids=s[None]).logits) for s in sequences)
    torch.testing.assert_close(checked, plain, atol=summation_atol(1 + max_logit, vocab), rtol=0)
    for name, grad in plain_grads.items():
        atol = summation_atol(max_abs(grad), vocab)
        torch.testing.assert_close(checked_grads[name], grad, atol=atol, rtol=0)
