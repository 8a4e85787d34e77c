"""Packed scoring (llmrl/policies/packing.py): the layout by hand, the padded path's values and
gradients to float rounding, which forward the wrappers take, and the fallback for a model whose
attention does not stay within a packed sequence."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Tokens
from llmrl.models import tiny_model
from llmrl.models.activation_checkpointing import enable_activation_checkpointing
from llmrl.policies import TransformersWrapper
from llmrl.policies.base import ScoreResult
from llmrl.policies.packing import pack_sequences, packing_problem, score_packed
from llmrl.policies.response_scoring import score_responses
from tests.support.packed_scoring import (
    BF16_ROUNDINGS,
    LENGTHS,
    PROMPTS,
    assert_same_scores,
    max_logit,
    sequences_of,
    values_and_grads,
)
from tests.tolerances import max_abs, rounding_atol


def test_sequences_are_laid_end_to_end_with_positions_restarting():
    a, b, c = torch.tensor([11, 12, 13]), torch.tensor([21, 22, 23, 24, 25]), torch.tensor([31, 32])
    packed = pack_sequences([a, b, c], first_scored=[1, 2, 1], pad_token_id=0)
    # rows of 5 (the longest): b fills row 0; a (3) then c (2) fill row 1
    assert packed.input_ids.tolist() == [[21, 22, 23, 24, 25], [11, 12, 13, 31, 32]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    # position t predicts token t + 1 of its own sequence: b's tokens 2-4 from positions 1-3,
    # a's tokens 1-2 from positions 0-1, c's token 1 from position 3
    assert packed.scored.tolist() == [
        [False, True, True, True, False],
        [True, True, False, True, False],
    ]
    assert packed.targets[packed.scored].tolist() == [23, 24, 25, 12, 13, 32]
    assert packed.rows.tolist() == [1, 1, 1, 0, 0, 2]
    assert packed.tokens.tolist() == [2, 3, 4, 1, 2, 1]
    assert packed.padding == 0


def test_a_row_with_free_space_ends_in_a_sequence_of_its_own():
    packed = pack_sequences([torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6])], [1, 1], 0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    # the tail restarts at 0: transformers sees a third sequence, and nothing reads its outputs
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1]]
    assert packed.padding == 2


@pytest.mark.parametrize(
    ("first", "message"), [([0, 1], "first_scored"), ([1], "strict|zip|length|index")]
)
def test_packing_refuses_what_has_no_prediction(first, message):
    with pytest.raises((ValueError, IndexError), match=message):
        pack_sequences([torch.tensor([1, 2]), torch.tensor([3])], first, 0)


@pytest.mark.parametrize("chunk_size", [None, 5, 1024], ids=["logits", "chunks", "one-chunk"])
@pytest.mark.parametrize("entropy", [False, True], ids=["", "entropy"])
def test_packed_responses_score_like_padded_rows(tiny, chunk_size, entropy):
    sequences = sequences_of(tiny.config.vocab_size)
    head = {"log_prob_chunk_size": chunk_size, "with_entropy": entropy}
    packed = values_and_grads(
        tiny, lambda: score_packed(tiny, sequences, PROMPTS, 0, "cpu", **head)
    )
    padded = values_and_grads(
        tiny,
        lambda: score_responses(tiny, sequences, PROMPTS, 0, "cpu", share_prompts=False, **head),
    )
    assert_same_scores(tiny, packed, padded, sequences)
    # the layout: each row's response tokens, 0 before its prompt ends and after it ends
    for row, (length, prompt) in enumerate(zip(LENGTHS, PROMPTS, strict=True)):
        assert (packed[0].log_probs[row, :prompt] == 0).all()
        assert (packed[0].log_probs[row, prompt:length] < 0).all()
        assert (packed[0].log_probs[row, length:] == 0).all()


def _forward_shapes(model) -> tuple[list[list[int]], torch.utils.hooks.RemovableHandle]:
    shapes: list[list[int]] = []

    def record(module, args, kwargs):
        shapes.append(list(kwargs["input_ids"].shape))

    return shapes, model.register_forward_pre_hook(record, with_kwargs=True)


def _tokens_batch(sequences, prompts) -> TensorDict:
    tokens = Tokens.from_sequences(
        prompt=[s[:n] for s, n in zip(sequences, prompts, strict=True)],
        response=[s[n:] for s, n in zip(sequences, prompts, strict=True)],
    )
    return TensorDict({"tokens": tokens}, batch_size=[len(sequences)])


@pytest.mark.parametrize("responses_only", [False, True], ids=["full", "responses"])
def test_the_wrapper_scores_packed_rows_by_default_and_padded_rows_when_told(
    tiny, tokenizer, responses_only
):
    sequences = sequences_of(tiny.config.vocab_size, seed=3)
    options = {
        "generate": False,
        "input_mode": "tokens",
        "pad_output": True,
        "return_entropy": True,
        "score_responses_only": responses_only,
    }
    packed_policy = TransformersWrapper(tiny, tokenizer, **options)
    padded_policy = TransformersWrapper(tiny, tokenizer, packing=False, **options)
    batch = _tokens_batch(sequences, PROMPTS)
    assert packing_problem(tiny) is None  # its probe's forwards run now, not under the hook

    def scores(policy):
        out = policy(batch.clone())
        return ScoreResult(log_probs=out["log_probs"].full, entropy=out["entropy"].full)

    shapes, hook = _forward_shapes(tiny)
    try:
        packed = values_and_grads(tiny, lambda: scores(packed_policy))
        padded = values_and_grads(tiny, lambda: scores(padded_policy))
    finally:
        hook.remove()
    # packed: 30 | 30 | 17 + 12 | 9 + 6 + 4 in rows of 30 (108 tokens, 12 positions of
    # padding); padded: 7 rows of 30, or with responses only, of the longest prompt (8,
    # left-padded) and the longest response (25, right-padded)
    assert shapes == [[4, 30], [len(sequences), 33 if responses_only else 30]]
    assert_same_scores(tiny, packed, padded, sequences)


def test_rows_sharing_a_long_prompt_keep_the_shared_prompt_forward(tiny, tokenizer):
    """G short responses to one long prompt cost fewer positions with the prompt computed once
    than packed (where every row holds its own copy); long responses the other way round."""
    vocab = tiny.config.vocab_size
    prompt = sequences_of(vocab, [40], seed=4)[0]
    cases = [
        # shared: 39 prefix + 4 x (1 + 3) = 55 positions; packed: 4 rows of 43 = 172
        ([3, 1, 2, 3], [[1, 39], [4, 4]]),
        # shared: 39 + 4 x (1 + 100) = 443; packed: 140 | 43 + 42 + 41 in rows of 140 = 280
        ([100, 1, 2, 3], [[2, 140]]),
    ]
    for response_lengths, want in cases:
        responses = sequences_of(vocab, response_lengths, seed=5)
        sequences = [torch.cat([prompt, r]) for r in responses]
        assert packing_problem(tiny) is None
        shapes, hook = _forward_shapes(tiny)
        try:
            with torch.no_grad():
                score_responses(tiny, sequences, [40] * 4, 0, "cpu", packing=True)
        finally:
            hook.remove()
        assert shapes == want


def test_activation_checkpointing_and_lora_score_packed_like_padded(tokenizer):
    from llmrl.config.common import LoraSettings
    from llmrl.train.lora import apply_lora

    model = apply_lora(tiny_model(tokenizer, seed=6), LoraSettings(enabled=True, r=4))
    enable_activation_checkpointing(model)
    model.train()  # checkpointing recomputes only in training mode; the tiny model has no dropout
    with torch.no_grad():  # adapters start at 0: give them weights so their gradients differ
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(7))
    sequences = sequences_of(model.config.vocab_size, seed=8)
    head = {"log_prob_chunk_size": 16, "with_entropy": True}
    packed = values_and_grads(
        model, lambda: score_packed(model, sequences, PROMPTS, 0, "cpu", **head)
    )
    padded = values_and_grads(
        model,
        lambda: score_responses(model, sequences, PROMPTS, 0, "cpu", share_prompts=False, **head),
    )
    assert all("lora" in name for name in packed[1])  # only the adapters train
    assert_same_scores(model, packed, padded, sequences)


def test_packed_rows_under_bfloat16_autocast_match_padded_rows_to_bfloat16_rounding(tiny):
    sequences = sequences_of(tiny.config.vocab_size, seed=9)
    head = {"log_prob_chunk_size": 64, "with_entropy": False}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed = values_and_grads(
            tiny, lambda: score_packed(tiny, sequences, PROMPTS, 0, "cpu", **head)
        )
        padded = values_and_grads(
            tiny,
            lambda: score_responses(
                tiny, sequences, PROMPTS, 0, "cpu", share_prompts=False, **head
            ),
        )
    # bf16 keeps 8 significant bits. Each bf16 matmul output rounds once; when packing changes
    # how a matmul is blocked, an output may round the other way (one ulp, 2**-8 relative), and
    # that difference passes through the remaining layers. The logits (<= max|z|) are the last
    # rounded values before the fp32 log-softmax: BF16_ROUNDINGS roundings of max|z| bound a
    # log-prob's move (z_y - lse, each term moved by at most that much).
    largest = max_logit(tiny, sequences)
    atol = rounding_atol(largest, torch.bfloat16, BF16_ROUNDINGS)
    torch.testing.assert_close(packed[0].log_probs, padded[0].log_probs, atol=atol, rtol=0)
    for name, grad in packed[1].items():
        want = padded[1][name]
        bound = rounding_atol(max_abs(want), torch.bfloat16, BF16_ROUNDINGS)
        torch.testing.assert_close(grad, want, atol=bound, rtol=0, msg=name)


def test_a_model_that_leaks_across_packed_sequences_is_scored_padded_with_the_reason_logged(
    tokenizer, monkeypatch, caplog
):
    from transformers import masking_utils

    model = tiny_model(tokenizer, seed=10)
    # transformers no longer sees packed sequences: one causal mask over the whole row
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda positions: None)
    options = {"generate": False, "input_mode": "tokens", "pad_output": True}
    policy = TransformersWrapper(model, tokenizer, **options)
    padded_policy = TransformersWrapper(model, tokenizer, packing=False, **options)
    sequences = sequences_of(model.config.vocab_size, seed=11)
    batch = _tokens_batch(sequences, PROMPTS)
    with caplog.at_level(logging.WARNING, logger="llmrl.policies.packing"):
        problem = packing_problem(model)
    assert problem is not None and "depend on the sequence before it" in problem
    assert "packing off for LlamaForCausalLM" in caplog.text
    shapes, hook = _forward_shapes(model)
    try:
        with torch.no_grad():
            got = policy(batch.clone())["log_probs"].full
            want = padded_policy(batch.clone())["log_probs"].full
    finally:
        hook.remove()
    assert shapes == [[len(sequences), 30]] * 2  # both padded
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def _mix_previous_token(fraction: float):
    """A forward hook adding ``fraction`` of the previous position's hidden state to each
    position, as a width-2 causal convolution does: causal within a row, blind to
    ``position_ids``, so it carries a little of sequence A into packed sequence B."""

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        previous = torch.zeros_like(hidden)
        previous[:, 1:] = hidden[:, :-1]
        mixed = hidden + fraction * previous
        return (mixed, *output[1:]) if isinstance(output, tuple) else mixed

    return hook


def test_a_weak_leak_across_packed_sequences_is_refused(tokenizer, caplog):
    """1% of one hidden state crossing the boundary moves the logits by ~5e-3: well under a
    tenth of what no packing at all moves them (the probe's old acceptance), well above
    rounding. Such a model is scored padded, exactly as padded rows are."""
    model = tiny_model(tokenizer, seed=10)
    model.model.layers[0].register_forward_hook(_mix_previous_token(0.01))
    with caplog.at_level(logging.WARNING, logger="llmrl.policies.packing"):
        problem = packing_problem(model)
    assert problem is not None and "depend on the sequence before it" in problem
    assert "packing off for LlamaForCausalLM" in caplog.text
    gap, rounding, leak = (float(x) for x in re.findall(r"(\d[\d.e+-]*)(?:,|;|\))", problem))
    assert rounding < gap < 0.1 * leak, problem  # a weak leak, above rounding
    options = {"generate": False, "input_mode": "tokens", "pad_output": True}
    policy = TransformersWrapper(model, tokenizer, **options)
    padded_policy = TransformersWrapper(model, tokenizer, packing=False, **options)
    batch = _tokens_batch(sequences_of(model.config.vocab_size, seed=11), PROMPTS)
    with torch.no_grad():
        got = policy(batch.clone())["log_probs"].full
        want = padded_policy(batch.clone())["log_probs"].full
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_an_attention_implementation_that_cannot_pack_is_named(tokenizer):
    model = tiny_model(tokenizer, seed=12)
    model.config._attn_implementation = "paged_attention"
    problem = packing_problem(model)
    assert problem is not None and "'paged_attention'" in problem and "sdpa" in problem


def test_a_model_that_packs_passes_the_probe(tiny):
    assert packing_problem(tiny) is None
    assert math.isfinite(max_logit(tiny, sequences_of(tiny.config.vocab_size, [4])))
