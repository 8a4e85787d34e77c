"""Sampling and scoring agree, modes agree, greedy equals HF, groups, concurrent callers.

The same checks run against the tiny EOS-biased model (fast) and once against the real
SmolLM2-135M (slow).
"""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Text, pad_sequences
from llmrl.policies import TransformersWrapper
from tests.support.chats import PROMPTS, history_batch
from tests.tolerances import log_prob_atol, max_abs


def _log_prob_atol(model, sequences: list[torch.Tensor]) -> float:
    """fp32 on CPU: sampling-time (KV-cache decode) and scoring-time (one pass) log-probs of the
    same tokens are the same sums in another order, the longest over the vocabulary
    (``log_prob_atol`` of the logits of ``sequences``: ~3e-4 for the tiny model, a few 1e-3
    for SmolLM2's larger logits). Temperature, filtering or an off-by-one position moves a
    log-prob by >= ~0.1."""
    with torch.no_grad():
        max_logit = max(max_abs(model(input_ids=s[None]).logits) for s in sequences)
    return log_prob_atol(max_logit, model.config.vocab_size)


def _sampler(model, tokenizer, **kwargs):
    kwargs.setdefault("generate_kwargs", {"max_new_tokens": 16, "seed": 0})
    return TransformersWrapper(model, tokenizer, **kwargs)


def _assert_log_probs_match(policy, out):
    scorer = policy.get_new_version(generate=False, input_mode="tokens")
    scored = scorer(out)
    sampled = out["log_probs"].as_list("response")
    rescored = scored["log_probs"].as_list("response")
    assert [len(s) for s in sampled] == [len(r) for r in rescored]
    atol = _log_prob_atol(policy.model, out["tokens"].as_list("full"))
    for row, (a, b) in enumerate(zip(sampled, rescored, strict=True)):
        assert torch.allclose(a, b, atol=atol, rtol=0), f"row {row}: max diff {(a - b).abs().max()}"


def test_sampling_log_probs_equal_scoring_log_probs(eos_model, tokenizer):
    policy = _sampler(eos_model, tokenizer, num_samples=4)
    out = policy(history_batch()).reshape(-1)
    responses = out["tokens"].as_list("response")
    lengths = {len(r) for r in responses}
    ends_with_eos = [bool(r[-1] == tokenizer.eos_token_id) for r in responses]
    assert len(lengths) > 2, "the batch should have ragged responses"
    assert any(ends_with_eos) and not all(ends_with_eos)
    # pad == eos: a real final EOS keeps its (non-zero) log-prob
    eos_log_probs = [
        lp[-1]
        for lp, eos in zip(out["log_probs"].as_list("response"), ends_with_eos, strict=True)
        if eos
    ]
    assert all(lp < 0 for lp in eos_log_probs)
    assert out["history"].full[ends_with_eos.index(True)][-1].is_complete
    _assert_log_probs_match(policy, out)


def test_padded_outputs_score_the_same(eos_model, tokenizer):
    policy = _sampler(eos_model, tokenizer, num_samples=2, pad_output=True)
    out = policy(history_batch()).reshape(-1)
    scorer = policy.get_new_version(generate=False, input_mode="tokens")
    scored = scorer(out)
    mask = out["masks"].response
    atol = _log_prob_atol(policy.model, out["tokens"].unpad(out["masks"]).as_list("full"))
    assert torch.allclose(
        out["log_probs"].response[mask], scored["log_probs"].response[mask], atol=atol, rtol=0
    )
    assert (out["log_probs"].response[~mask] == 0).all()


def test_history_text_and_tokens_modes_give_the_same_tokens(eos_model, tokenizer):
    batch = history_batch()
    by_history = _sampler(eos_model, tokenizer, generate=False, input_mode="history")
    # score full conversations (prompt + an assistant answer) in every mode
    answered = [
        [*p, {"role": "assistant", "content": f"Answer {i} ✓"}] for i, p in enumerate(PROMPTS)
    ]
    full_batch = history_batch(answered)
    full_batch["history"].full = full_batch["history"].prompt
    full_batch["history"].prompt = batch["history"].prompt
    from_history = by_history(full_batch)

    texts = from_history["text"]
    by_text = by_history.get_new_version(input_mode="text")
    text_batch = full_batch.select("row_id").clone()
    text_batch["text"] = texts
    from_text = by_text(text_batch)

    by_tokens = by_history.get_new_version(input_mode="tokens")
    from_tokens = by_tokens(from_history.select("tokens", "row_id"))

    expected = from_history["tokens"].as_list("full")
    for other in (from_text, from_tokens):
        assert [t.tolist() for t in other["tokens"].as_list("full")] == [
            t.tolist() for t in expected
        ]
        # the same tokens through the same scorer and shapes: bitwise equal (allclose's
        # defaults would allow ~1e-4 at |log p| ~ 10)
        assert all(
            torch.allclose(a, b)
            for a, b in zip(
                other["log_probs"].as_list("full"),
                from_history["log_probs"].as_list("full"),
                strict=True,
            )
        )
    # the prompt/response split is known in history mode: response log-probs are the tail
    response_lp = from_history["log_probs"].as_list("response")
    prompt_len = [len(p) for p in from_history["tokens"].as_list("prompt")]
    for lp, full_lp, cut in zip(
        response_lp, from_history["log_probs"].as_list("full"), prompt_len, strict=True
    ):
        assert torch.equal(lp, full_lp[cut:])


def test_greedy_equals_plain_hf_generate(eos_model, tokenizer):
    policy = _sampler(
        eos_model, tokenizer, generate_kwargs={"max_new_tokens": 10, "do_sample": False}
    )
    out = policy(history_batch())
    prompts = out["tokens"].as_list("prompt")
    input_ids, mask = pad_sequences(prompts, "left", tokenizer.pad_token_id)
    reference = eos_model.generate(
        input_ids=input_ids,
        attention_mask=mask.long(),
        do_sample=False,
        max_new_tokens=10,
        pad_token_id=tokenizer.pad_token_id,
    )[:, input_ids.shape[1] :]
    for row, response in enumerate(out["tokens"].as_list("response")):
        assert response.tolist() == reference[row, : len(response)].tolist()
        rest = reference[row, len(response) :]
        assert (rest == tokenizer.pad_token_id).all(), "HF kept generating after our response ended"


def test_num_samples_groups_distinct_samples_by_prompt(tiny, tokenizer):
    policy = _sampler(tiny, tokenizer, num_samples=4)
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 4])
    for b in range(3):
        group = out[b]
        assert (group["row_id"] == b).all()
        prompts = group["tokens"].as_list("prompt")
        assert all(torch.equal(p, prompts[0]) for p in prompts)
        responses = {tuple(r.tolist()) for r in group["tokens"].as_list("response")}
        assert len(responses) == 4, "the 4 samples of a prompt must differ"
        assert group["history"].prompt[0].to_chats() == group["history"].prompt[3].to_chats()


WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "violin",
    "desert",
    "candle",
    "orbit",
    "maple",
    "harbor",
    "pencil",
    "comet",
    "garden",
    "lantern",
    "puzzle",
]


def _text_batch(prompts: list[str], first_id: int = 0) -> TensorDict:
    return TensorDict(
        {
            "text": Text.from_strings(prompt=prompts),
            "row_id": torch.arange(first_id, first_id + len(prompts)),
        },
        batch_size=[len(prompts)],
    )


def test_sixteen_threads_get_their_own_answers(tiny, tokenizer):
    prompts = [f"Tell me about the {word}" for word in WORDS]
    greedy = {"max_new_tokens": 6, "do_sample": False}
    plain = _sampler(tiny, tokenizer, input_mode="text", generate_kwargs=greedy)
    expected = [r.tolist() for r in plain(_text_batch(prompts))["tokens"].as_list("response")]
    assert len({tuple(e) for e in expected}) == 16, "fixture: the 16 prompts must differ in output"

    policy = plain.get_new_version(min_batch_size=4, max_batch_size=8, batching_timeout=0.5)
    answers: dict[int, tuple] = {}
    barrier = threading.Barrier(16)

    def ask(i: int) -> None:
        barrier.wait()
        row = policy(_text_batch([prompts[i]], first_id=i)[0])
        answers[i] = (row["row_id"].item(), row["tokens"].response.tolist())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    policy.close()
    assert sorted(answers) == list(range(16))
    assert policy._batcher.batches_processed < 16, "requests should have been served in batches"
    for i in range(16):
        assert answers[i] == (i, expected[i]), f"thread {i} got another prompt's answer"


@pytest.mark.slow
def test_real_smollm2_consistency(tokenizer):
    from llmrl.models import load_model

    model = load_model("smollm2-135m-instruct")
    policy = TransformersWrapper(
        model, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 24, "seed": 0}
    )
    out = policy(history_batch()).reshape(-1)
    responses = out["tokens"].as_list("response")
    assert len({len(r) for r in responses}) > 1
    _assert_log_probs_match(policy, out)
    greedy = policy.get_new_version(
        generate_kwargs={"max_new_tokens": 16, "do_sample": False}, num_samples=None
    )
    answer = greedy(
        history_batch([[{"role": "user", "content": "What is the capital of France?"}]])
    )
    assert "Paris" in answer["text"][0].response
