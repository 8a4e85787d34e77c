"""TransformersWrapper: input modes, output layouts, validation errors, scoring with gradients."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Text, Tokens
from llmrl.policies import GenerationKwargsError, TransformersWrapper
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs, summation_atol

SHORT = {"max_new_tokens": 5, "seed": 0}


def _policy(model, tokenizer, **kwargs):
    kwargs.setdefault("generate_kwargs", SHORT)
    return TransformersWrapper(model, tokenizer, **kwargs)


def test_history_mode_outputs(eos_model, tokenizer):
    out = _policy(eos_model, tokenizer)(history_batch())
    assert out.batch_size == torch.Size([3])
    tokens, masks = out["tokens"], out["masks"]
    for row in range(3):
        prompt, response, full = (tokens.as_list(k)[row] for k in ("prompt", "response", "full"))
        assert torch.equal(full, torch.cat([prompt, response]))
        assistant = masks.as_list("assistant")[row]
        assert assistant[len(prompt) :].all()
        # the multi-turn prompt (row 2) carries its earlier assistant turn in the mask
        assert assistant[: len(prompt)].any() == (row == 2)
        reply = out["history"].full[row][-1]
        assert reply.role == "assistant"
        assert out["text"][row].full == out["text"][row].prompt + out["text"][row].response
    assert out["text"][0].prompt.endswith("<|im_start|>assistant\n")


def test_padded_output_layout(eos_model, tokenizer):
    out = _policy(eos_model, tokenizer, pad_output=True)(history_batch())
    tokens, masks = out["tokens"], out["masks"]
    assert tokens.is_padded
    prompt_width = tokens.prompt.shape[1]
    assert torch.equal(tokens.full, torch.cat([tokens.prompt, tokens.response], dim=1))
    assert masks.prompt[:, -1].all(), "prompts are left-padded: last column is always real"
    assert masks.response[:, 0].all(), "responses are right-padded: first column is always real"
    assert torch.equal(masks.assistant[:, prompt_width:], masks.response)
    assert out["log_probs"].response.shape == tokens.response.shape


def test_text_mode_generation_and_scoring(eos_model, tokenizer):
    td = TensorDict({"text": Text.from_strings(prompt=["Once upon", "2 + 2 ="])}, batch_size=[2])
    out = _policy(eos_model, tokenizer, input_mode="text")(td)
    assert [str(p) for p in out["text"].prompt] == ["Once upon", "2 + 2 ="]
    expected = tokenizer("Once upon", add_special_tokens=False)["input_ids"]
    assert out["tokens"].as_list("prompt")[0].tolist() == expected
    scorer = _policy(eos_model, tokenizer, input_mode="text", generate=False)
    scored = scorer(out.select("text"))

    # text mode scores the text as the tokenizer reads it back (a sampled token sequence
    # need not survive decode + encode unchanged)
    def encoded(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    assert [len(r) for r in scored["log_probs"].as_list("response")] == [
        encoded(t.full) - encoded(t.prompt) for t in out["text"]
    ]


def test_tokens_mode_accepts_padded_input_with_masks(eos_model, tokenizer):
    ragged = Tokens.from_sequences(prompt=[torch.tensor([504, 3458, 28]), torch.tensor([28])])
    padded, masks = ragged.pad(tokenizer.pad_token_id)
    td = TensorDict({"tokens": padded, "masks": masks}, batch_size=[2])
    out = _policy(
        eos_model,
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": 3, "do_sample": False},
    )(td)
    out_ragged = _policy(
        eos_model,
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": 3, "do_sample": False},
    )(TensorDict({"tokens": ragged}, batch_size=[2]))
    assert [p.tolist() for p in out["tokens"].as_list("prompt")] == [[504, 3458, 28], [28]]
    assert [r.tolist() for r in out["tokens"].as_list("response")] == [
        r.tolist() for r in out_ragged["tokens"].as_list("response")
    ]
    with pytest.raises(KeyError, match=r"padded tokens need their masks: \('masks', 'prompt'\)"):
        _policy(eos_model, tokenizer, input_mode="tokens")(TensorDict({"tokens": padded}, [2]))


def test_scoring_keeps_gradients_and_returns_logits_when_asked(tiny, tokenizer):
    scorer = _policy(tiny, tokenizer, generate=False, return_logits=True, pad_output=True)
    answered = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]]
    td = history_batch(answered)
    td["history"].full = td["history"].prompt
    td["history"].prompt = None
    out = scorer(td)
    assert out["logits"].shape[:2] == out["tokens"].full.shape
    assert out["logits"].shape[-1] == len(tokenizer)
    loss = -(out["log_probs"].full * out["masks"].assistant).sum()
    loss.backward()
    grads = [p.grad for p in tiny.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny.zero_grad(set_to_none=True)
    assert "logits" not in set(_policy(tiny, tokenizer, generate=False)(td).keys())


def test_stop_sequences_end_a_response(tiny, tokenizer):
    # Seeded sampling is reproducible; stop on a piece of a free run and check the cut.
    greedy = {"max_new_tokens": 8, "seed": 3}
    td = TensorDict({"text": Text.from_strings(prompt=["Tell me about the apple"])}, [1])
    free = _policy(tiny, tokenizer, input_mode="text", generate_kwargs=greedy)(td)
    tokens = free["tokens"].as_list("response")[0]
    # stop on the first token whose text has not appeared before it
    cut_at = next(
        k
        for k in range(1, len(tokens))
        if tokenizer.decode(tokens[k : k + 1]).strip()
        and tokenizer.decode(tokens[k : k + 1]) not in tokenizer.decode(tokens[:k])
    )
    stop_text = tokenizer.decode(tokens[cut_at : cut_at + 1])
    stopped = _policy(
        tiny,
        tokenizer,
        input_mode="text",
        generate_kwargs={**greedy, "stop_sequences": [stop_text]},
    )(td)
    cut = stopped["tokens"].as_list("response")[0]
    assert cut.tolist() == tokens[: cut_at + 1].tolist()
    assert stopped["text"][0].response.endswith(stop_text)
    assert len(stopped["log_probs"].as_list("response")[0]) == cut_at + 1


def test_get_new_version_shares_the_model(tiny, tokenizer):
    sampler = _policy(tiny, tokenizer, num_samples=2)
    scorer = sampler.get_new_version(generate=False)
    assert scorer.model is sampler.model
    assert scorer.input_key == ("history", "full") and sampler.input_key == ("history", "prompt")
    assert scorer.num_samples == 2 and sampler.generate
    with pytest.raises(TypeError, match=r"unknown settings \['temprature'\]"):
        sampler.get_new_version(temprature=0.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"input_mode": "images"},
            ValueError,
            r"input_mode must be one of \['history', 'text', 'tokens'\], got 'images'",
        ),
        (
            {"generate_kwargs": {"temperature": -1.0}},
            GenerationKwargsError,
            "temperature must be >= 0",
        ),
        ({"generate_kwargs": {"top_p": 1.2}}, GenerationKwargsError, r"top_p must be in \[0, 1\]"),
        ({"generate_kwargs": {"top_k": 0}}, GenerationKwargsError, "top_k must be >= 1"),
        (
            {"generate_kwargs": {"repetition_penalty": 0.0}},
            GenerationKwargsError,
            "repetition_penalty must be > 0",
        ),
        (
            {"generate_kwargs": {"do_sample": False, "temperature": 0.3}},
            GenerationKwargsError,
            "do_sample=False",
        ),
        (
            {"generate_kwargs": {"n": 2}, "num_samples": 3},
            GenerationKwargsError,
            "num_samples=3 contradicts",
        ),
    ],
)
def test_constructor_validation(tiny, tokenizer, kwargs, error, match):
    with pytest.raises(error, match=match):
        TransformersWrapper(tiny, tokenizer, **kwargs)


def test_missing_input_key_names_the_key_and_the_keys_present(tiny, tokenizer):
    td = TensorDict({"text": Text.from_strings(prompt=["x"]), "row_id": torch.zeros(1)}, [1])
    with pytest.raises(
        KeyError,
        match=(
            r"input key \('history', 'prompt'\) not found: the input has no 'history'; "
            r"keys present: \['row_id', 'text', 'text.prompt'\]"
        ),
    ):
        _policy(tiny, tokenizer)(td)
    with pytest.raises(
        TypeError, match=r"input key \('text', 'prompt'\) holds LinkedList, expected History"
    ):
        _policy(tiny, tokenizer, input_key=("text", "prompt"))(td)


def _max_logit(model, tokens) -> float:
    """``max|z|`` over the logits of the full sequences of ``tokens``, one at a time."""
    with torch.no_grad():
        return max(max_abs(model(input_ids=s[None]).logits) for s in tokens.as_list("full"))


def test_single_row_in_single_row_out(tiny, tokenizer):
    row = history_batch()[0]
    out = _policy(tiny, tokenizer)(row)
    assert out.batch_size == torch.Size([])
    assert out["tokens"].response.dim() == 1


@pytest.mark.parametrize("samples", [1, 3], ids=["distinct-prompts", "shared-prompts"])
def test_response_only_scoring_matches_full_scoring(tiny, tokenizer, samples):
    """Scoring only the responses (output layer over response columns; shared prompts computed
    once) gives the full pass's log-probs on every response token, 0 on prompt tokens, and the
    same gradients."""
    sampler = _policy(
        tiny, tokenizer, num_samples=samples, generate_kwargs={"max_new_tokens": 6, "seed": 1}
    )
    batch = sampler(history_batch()).reshape(-1)
    full = sampler.get_new_version(generate=False, input_mode="tokens", pad_output=True)
    responses_only = full.get_new_version(score_responses_only=True)

    expected, got = full(batch), responses_only(batch)
    masks = expected["masks"]
    # padded layout: left-padded prompt columns, then right-padded response columns
    in_response = torch.zeros_like(masks.full)
    in_response[:, masks.prompt.shape[1] :] = masks.response
    assert in_response.sum() == sum(len(r) for r in batch["tokens"].as_list("response"))
    want, have = expected["log_probs"].full, got["log_probs"].full
    # the output layer over fewer columns (and shared prompts through a cache): the same fp32
    # sums in another order, the longest over the vocabulary (log_prob_atol; measured 1e-6)
    vocab = tiny.config.vocab_size
    atol = log_prob_atol(_max_logit(tiny, batch["tokens"]), vocab)
    torch.testing.assert_close(have[in_response], want[in_response], atol=atol, rtol=0)
    assert (have[~in_response] == 0).all()
    assert (want[~in_response & masks.full].abs() > 0).any()  # the full pass did score prompts

    grads = []
    for log_probs in (want, have):
        tiny.zero_grad(set_to_none=True)
        log_probs[in_response].sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in tiny.parameters()])
    tiny.zero_grad(set_to_none=True)
    # every gradient flows back through grad_logits @ W, a sum over the vocabulary: the same
    # sum in another order, each tensor at its own magnitude
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=summation_atol(max_abs(b), vocab), rtol=0)


def test_shared_prompt_scoring_takes_the_cached_path(tiny, tokenizer, monkeypatch):
    """Rows sharing a prompt go through the one-prompt-pass path; distinct prompts do not."""
    from llmrl.policies import response_scoring

    calls = []
    original = response_scoring._shared_prompts
    monkeypatch.setattr(
        response_scoring,
        "_shared_prompts",
        lambda *args: calls.append(len(args[1])) or original(*args),
    )
    prompt_a, prompt_b = torch.tensor([5, 6, 7]), torch.tensor([8, 9])
    rows = [
        torch.cat([p, torch.tensor(r)])
        for p, r in [(prompt_a, [1, 2]), (prompt_a, [3]), (prompt_b, [4, 4, 4]), (prompt_b, [2])]
    ]
    scores = response_scoring.score_responses(tiny, rows, [3, 3, 2, 2], 0, "cpu").log_probs
    assert calls == [2]  # two distinct prompts for four rows
    assert scores.shape == (4, 5)
    assert (scores[0, :3] == 0).all() and (scores[0, 3:5] != 0).all()
    assert (scores[1, 4:] == 0).all() and (scores[2, :2] == 0).all()
    response_scoring.score_responses(tiny, rows[::2], [3, 2], 0, "cpu")
    assert calls == [2]  # all prompts distinct: one plain pass


def test_repeated_prompts_share_one_prefill_and_sample_as_before(tiny, tokenizer, monkeypatch):
    """Rows repeating a prompt (or num_samples > 1) are prefilled once through a shared KV
    cache; the tokens and sampling log-probs equal those of generating without it."""
    from llmrl.policies import decode_loop, prompt_cache

    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a longer one"}]]
    greedy = {"max_new_tokens": 5, "do_sample": False}
    policy = _policy(tiny, tokenizer, num_samples=3, generate_kwargs=greedy)
    shared = policy(history_batch(chats))
    caches = []

    def unshared(model, input_ids, mask):
        """Records the cache sharing would build, and prefills every row on its own instead."""
        caches.append(prompt_cache.shared_prompt_cache(model, input_ids, mask))
        return prompt_cache.prompt_prefix_cache(model, input_ids, mask, share=False)

    monkeypatch.setattr(decode_loop, "prompt_prefix_cache", unshared)
    plain = policy(history_batch(chats))
    assert len(caches) == 1 and caches[0] is not None
    assert caches[0].get_seq_length() > 0 and caches[0].layers[0].keys.shape[0] == 6

    def rows(out, key):
        return out[key].reshape(-1).as_list("response")

    pairs = zip(rows(shared, "tokens"), rows(plain, "tokens"), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    # the same tokens' log-probs through another cache layout: fp32 sums in another order, the
    # longest over the vocabulary (log_prob_atol)
    atol = log_prob_atol(_max_logit(tiny, shared["tokens"].reshape(-1)), tiny.config.vocab_size)
    pairs = zip(rows(shared, "log_probs"), rows(plain, "log_probs"), strict=True)
    for a, b in pairs:
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_no_shared_cache_for_distinct_prompts(tiny):
    from llmrl.policies.prompt_cache import distinct_rows, shared_prompt_cache

    rows = torch.tensor([[0, 5, 6], [7, 8, 9]])
    assert shared_prompt_cache(tiny, rows, torch.ones_like(rows)) is None
    assert shared_prompt_cache(tiny, rows[:, :1].repeat(2, 1), torch.ones(4, 1)) is None
    assert distinct_rows([torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([1, 2])]) == (
        [0, 1],
        [0, 1, 0],
    )


def _requests_with_ids() -> list[TensorDict]:
    """Two env workers' requests: prompts 0-1 and prompt 2, each row named by ``prompt_id``."""
    from tensordict import NonTensorStack

    batch = history_batch()
    batch.set("prompt_id", NonTensorStack("p0", "p1", "p2"))
    return [batch[:2], batch[2:]]


@pytest.mark.parametrize("with_ids", [True, False])
def test_batched_requests_are_served_by_prompt_id_not_arrival(eos_model, tokenizer, with_ids):
    policy = TransformersWrapper(
        eos_model, tokenizer, generate_kwargs={"max_new_tokens": 8, "do_sample": True}
    )
    first, second = _requests_with_ids()
    if not with_ids:
        first, second = first.exclude("prompt_id"), second.exclude("prompt_id")

    def responses(requests: list[TensorDict]) -> list[list[list[int]]]:
        torch.manual_seed(0)  # a seeded engine: one stream for the whole batch
        outs = policy._forward_many(requests)
        return [[r.tolist() for r in out["tokens"].as_list("response")] for out in outs]

    in_order = responses([first, second])
    swapped = responses([second, first])
    # each request gets its own rows back, whatever the order it came in
    assert [len(rows) for rows in in_order] == [2, 1] and [len(r) for r in swapped] == [1, 2]
    if with_ids:  # same draws for the same prompts: the arrival order does not matter
        assert swapped == [in_order[1], in_order[0]]
    else:  # arrival order: the first request takes the first draws
        assert swapped != [in_order[1], in_order[0]]


def _global_rng_states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return states


@pytest.mark.parametrize(
    "settings",
    [{}, {"repetition_penalty": 1.3}],
    ids=["decode-loop", "generate"],  # repetition_penalty goes to generate
)
def test_seeded_sampling_repeats_from_a_generator_of_its_own(eos_model, tokenizer, settings):
    def sample(seed: int) -> tuple[list[list[int]], list[torch.Tensor]]:
        kwargs = {"max_new_tokens": 8, "seed": seed, **settings}
        policy = _policy(eos_model, tokenizer, num_samples=2, generate_kwargs=kwargs)
        out = policy(history_batch()).reshape(-1)
        tokens = [t.tolist() for t in out["tokens"].as_list("response")]
        return tokens, out["log_probs"].as_list("response")

    before = _global_rng_states()
    tokens, log_probs = sample(seed=11)
    again, again_log_probs = sample(seed=11)
    assert again == tokens
    assert all(torch.equal(a, b) for a, b in zip(again_log_probs, log_probs, strict=True))
    assert sample(seed=12)[0] != tokens
    # neither reseeded nor advanced: the caller's streams go on as if nothing had been drawn
    after = _global_rng_states()
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_by_default_a_cpu_model_samples_with_the_decode_loop(tiny, tokenizer, monkeypatch):
    policy = _policy(tiny, tokenizer)
    assert policy.compile_decode is None and policy.compile_seconds is None

    def no_generate(*args, **kwargs):
        raise AssertionError("a CPU model should not go through generate")

    monkeypatch.setattr(tiny, "generate", no_generate)
    assert len(policy(history_batch())["tokens"].as_list("response")) == 3


def test_share_prompt_prefix_reaches_the_decode_loop_and_survives_new_versions(
    tiny, tokenizer, monkeypatch
):
    """The option is what the decode loop gets (on for the eval stage's policies, off by
    default), a twin keeps it, and chats that share a system prompt answer as without it."""
    from llmrl.policies import decode_loop

    system = {"role": "system", "content": "Answer with the number only, after four hashes."}
    chats = [[system, {"role": "user", "content": q}] for q in ("1 + 1?", "What is 20 - 3?")]
    greedy = {"max_new_tokens": 5, "do_sample": False}
    seen = []
    real = decode_loop.decode

    def recording(*args, **kwargs):
        seen.append(kwargs.get("share_prefix"))
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_loop, "decode", recording)
    plain = _policy(tiny, tokenizer, generate_kwargs=greedy)
    shared = plain.get_new_version(share_prompt_prefix=True)
    assert not plain.share_prompt_prefix and shared.get_new_version().share_prompt_prefix
    expected = plain(history_batch(chats))["tokens"].as_list("response")
    got = shared(history_batch(chats))["tokens"].as_list("response")
    assert seen == [False, True]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_the_eval_stage_prefills_the_shared_system_prompt_once(tokenizer, monkeypatch, tmp_path):
    from llmrl.config.evaluate import EvalConfig
    from llmrl.stages import evaluate

    monkeypatch.setattr(evaluate, "load_model", lambda *args, **kwargs: object())
    config = EvalConfig(data={"path": str(tmp_path)}, output_dir=str(tmp_path), label="m")
    make = evaluate._policy_factory(config, tokenizer)
    assert make({"max_new_tokens": 4}).share_prompt_prefix
