"""llmrl's decode loop against ``generate``: greedy tokens, log-probs, the sampling filters and
the inverse-CDF draw, and finished rows leaving the batch."""

from __future__ import annotations

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from llmrl.data import pad_sequences
from llmrl.policies import GenerationKwargs, TransformersWrapper, decode_loop
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs, sampling_atol


def _prompts(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    texts = ["Once upon a time", "2 + 2 =", "Hi"]
    ids = [torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    input_ids, mask = pad_sequences(ids, "left", tokenizer.pad_token_id)
    return input_ids, mask.long()


@pytest.mark.parametrize("model_name", ["tiny", "eos_model"])
def test_greedy_decoding_matches_generate(model_name, tokenizer, request):
    """Same tokens, and the log-probs of generate's own logits up to summation order."""
    model = request.getfixturevalue(model_name)
    input_ids, mask = _prompts(tokenizer)
    config = GenerationKwargs(max_new_tokens=10, do_sample=False)
    eos = tokenizer.eos_token_id
    tokens, log_probs = decode_loop.decode(model, input_ids, mask, config, {eos}, eos)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=eos,
        eos_token_id=eos,
        output_logits=True,
        return_dict_in_generate=True,
    )
    expected = out.sequences[:, input_ids.shape[1] :]
    assert torch.equal(tokens[:, : expected.shape[1]], expected)
    assert (tokens[:, expected.shape[1] :] == eos).all()  # generate stops when all rows ended
    # the loop's forward and log-softmax against generate's: the same fp32 sums in another
    # order, the longest over the vocabulary
    vocab = out.logits[0].shape[-1]
    atol = log_prob_atol(max(max_abs(logits) for logits in out.logits), vocab)
    for step, logits in enumerate(out.logits):
        chosen = logits.float().log_softmax(-1).gather(-1, expected[:, step : step + 1])
        ran = expected[:, :step].ne(eos).all(1)  # rows still decoding at this step
        torch.testing.assert_close(log_probs[ran, step], chosen[ran, 0], atol=atol, rtol=0)


def test_top_k_and_top_p_keep_what_transformers_keeps():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    for top_k, top_p in [(5, 1.0), (None, 0.7), (10, 0.5), (None, 0.01)]:
        config = GenerationKwargs(top_k=top_k, top_p=top_p, temperature=0.7)
        ours = decode_loop.filtered_logits(logits, config)
        theirs = logits / 0.7  # the same division: kept values are bitwise equal
        if top_k:
            theirs = TopKLogitsWarper(top_k)(None, theirs)
        if top_p < 1:
            theirs = TopPLogitsWarper(top_p)(None, theirs)
        assert torch.equal(ours.isinf(), theirs.isinf()), (top_k, top_p)
        assert (~ours.isinf()).sum(-1).min() >= 1
        torch.testing.assert_close(ours[~ours.isinf()], theirs[~theirs.isinf()])


def _draws(logits: torch.Tensor, seed: int, **settings) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return decode_loop.next_tokens(logits, GenerationKwargs(**settings), generator)


def test_the_draw_follows_the_probabilities():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.log().expand(20_000, 4)
    draws = _draws(logits, seed=0)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    # 3 standard errors of a frequency near 0.5 (the largest: p (1 - p) <= 1/4) over 20 000
    # draws: 0.011 (seeded: the same draws every run; a wrong temperature or an off-by-one
    # category moves a frequency by >= 0.07)
    atol = sampling_atol(0.5, len(draws), sigmas=3)
    torch.testing.assert_close(frequencies, probs, atol=atol, rtol=0)
    assert frequencies[3] == 0
    greedy = decode_loop.next_tokens(logits[:2], GenerationKwargs(do_sample=False))
    assert greedy.tolist() == [0, 0]


def test_the_draw_at_a_temperature_follows_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).expand(20_000, 4)
    expected = (logits[0] / 0.5).softmax(-1)  # [0.865, 0.117, 0.016, 0.002]
    draws = _draws(logits, seed=1, temperature=0.5)
    frequencies = torch.bincount(draws, minlength=4) / len(draws)
    # within 4 binomial standard errors of each probability
    bound = 4 * (expected * (1 - expected) / len(draws)).sqrt()
    assert ((frequencies - expected).abs() <= bound).all(), (frequencies, expected)


def test_top_k_1_sampling_is_greedy():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(2))
    assert torch.equal(_draws(logits, seed=3, top_k=1), logits.argmax(-1))


def test_a_seeded_draw_repeats_and_leaves_the_global_generator_alone():
    logits = torch.zeros(256, 8)  # uniform: any two different streams differ somewhere
    state = torch.get_rng_state()
    first = _draws(logits, seed=5)
    assert torch.equal(_draws(logits, seed=5), first)
    assert not torch.equal(_draws(logits, seed=6), first)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_generate_processor_keeps_only_the_drawn_token():
    """Run greedy, ``generate`` picks what our draw picked: the same token as the loop's."""
    scores = torch.randn(5, 30, generator=torch.Generator().manual_seed(4))
    config = GenerationKwargs(temperature=0.7, top_k=10)
    processed = decode_loop.InverseCDFDraw(config, torch.Generator().manual_seed(7))(None, scores)
    expected = _draws(scores, seed=7, temperature=0.7, top_k=10)
    assert torch.equal(processed.argmax(-1), expected)
    assert (processed.isfinite().sum(-1) == 1).all()


def test_finished_rows_leave_the_batch(eos_model, tokenizer):
    """Each step computes only the rows that have not emitted their end token."""
    widths = []
    hook = eos_model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    try:
        policy = TransformersWrapper(
            eos_model, tokenizer, num_samples=4, generate_kwargs={"max_new_tokens": 24, "seed": 0}
        )
        out = policy(history_batch()).reshape(-1)
    finally:
        hook.remove()
    lengths = [len(r) for r in out["tokens"].as_list("response")]
    steps = widths[1:]  # after the one prefill of the three distinct prompts
    assert widths[0] == 3 and steps[0] == 12
    # the rows at step s are those whose response is longer than s tokens
    assert steps == [sum(length > s for length in lengths) for s in range(len(steps))]
    assert steps[-1] < 12


def test_settings_the_loop_lacks_go_to_generate():
    assert decode_loop.supports(GenerationKwargs(top_k=5, top_p=0.9, temperature=0.5))
    assert not decode_loop.supports(GenerationKwargs(repetition_penalty=1.2))


def _shared_start_prompts(tokenizer) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-padded prompts that start with the same 12+ tokens and differ after (an eval batch:
    one system prompt, different questions of different lengths), and the shared length."""
    system = "You are a careful assistant. Answer with the number only, after four hashes."
    questions = ["What is 12 + 7?", "What is 3 - 45 minus 2?", "Sum?", "What is 99 + 1?"]
    head = tokenizer(system, add_special_tokens=False)["input_ids"]
    ids = [
        torch.tensor(head + tokenizer(" " + q, add_special_tokens=False)["input_ids"])
        for q in questions
    ]
    input_ids, mask = pad_sequences(ids, "left", tokenizer.pad_token_id)
    return input_ids, mask.long(), len(head)


def test_common_prefix_cache_gives_each_row_its_own_next_token_distribution(tiny, tokenizer):
    """The next-token logits after the cached prompt equal those of each unpadded prompt run
    alone (fp32: a few float32 roundings of O(1) activations, so 1e-4 is loose)."""
    from llmrl.policies.prompt_cache import common_prefix_cache

    input_ids, mask, head = _shared_start_prompts(tokenizer)
    cache, cache_mask = common_prefix_cache(tiny, input_ids, mask)
    lengths = mask.sum(-1)
    assert cache_mask[:, :head].all(), "the shared system prompt is one block of ones"
    assert torch.equal(cache_mask.sum(-1), lengths - 1), "each row's prompt but its last token"
    step_mask = torch.cat([cache_mask, cache_mask.new_ones(len(mask), 1)], dim=1)
    logits = tiny(
        input_ids=input_ids[:, -1:],
        attention_mask=step_mask,
        position_ids=(lengths - 1)[:, None],
        past_key_values=cache,
        use_cache=True,
    ).logits[:, -1]
    for row, length in enumerate(lengths.tolist()):
        alone = tiny(input_ids=input_ids[row : row + 1, -length:]).logits[0, -1]
        torch.testing.assert_close(logits[row], alone, atol=1e-4, rtol=0)


def test_common_prefix_cache_needs_a_common_prefix(tiny, tokenizer):
    from llmrl.policies.prompt_cache import common_prefix_cache

    input_ids, mask = _prompts(tokenizer)  # three unrelated prompts
    assert common_prefix_cache(tiny, input_ids, mask) is None


@pytest.mark.parametrize("model_name", ["tiny", "eos_model"])
def test_greedy_decoding_with_a_shared_prefix_gives_the_same_tokens(model_name, tokenizer, request):
    model = request.getfixturevalue(model_name)
    input_ids, mask, _ = _shared_start_prompts(tokenizer)
    config = GenerationKwargs(max_new_tokens=10, do_sample=False)
    eos = tokenizer.eos_token_id
    plain, plain_lp = decode_loop.decode(model, input_ids, mask, config, {eos}, eos)
    shared, shared_lp = decode_loop.decode(
        model, input_ids, mask, config, {eos}, eos, share_prefix=True
    )
    assert torch.equal(shared, plain)
    # the same tokens through another cache layout: fp32 sums in another order, the longest
    # over the vocabulary (log_prob_atol of the decoded sequences' logits)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([input_ids, plain], 1),
            attention_mask=torch.cat([mask, torch.ones_like(plain)], 1),
        ).logits
    atol = log_prob_atol(max_abs(logits), logits.shape[-1])
    torch.testing.assert_close(shared_lp, plain_lp, atol=atol, rtol=0)
