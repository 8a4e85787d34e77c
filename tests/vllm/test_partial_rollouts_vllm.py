"""Segmented sampling (partial rollouts' policy side) on vLLM's CPU build: replies decoded a
segment at a time by a ``vLLMWrapper`` with ``segment_tokens``, each resumed from its prefix
(prompt + reply so far sent as the prompt of the next request), under the same weights or
across a weight load into the running engine.

One engine (the tiny random Llama: its replies never end early, so every row runs to the
budget). One of the prompts is longer than vLLM's CPU block of 128 tokens: its first block is
then served from the prefix cache when the reply resumes, and after a weight load that cache
must be gone (the control test shows what a stale one does).
"""

from __future__ import annotations

import pytest
import torch

from llmrl.core.weights_checksum import weights_checksum
from llmrl.policies.segments import PARTIAL_KEY, Prefix, attach_prefixes
from llmrl.policies.vllm_wrapper import vLLMWrapper
from tests.support.chats import PROMPTS, history_batch
from tests.support.segments import resume_until_done
from tests.vllm.conftest import ATOL, assert_close_rows, hf_log_probs, perturbed

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BUDGET = 12
LONG_CHAT = [{"role": "user", "content": "The history of the harbour town. " * 30}]
"""About 230 tokens once templated: more than one 128-token block of vLLM's prefix cache."""
LONG_ROW = len(PROMPTS)


def _batch():
    return history_batch([*PROMPTS, LONG_CHAT])


@pytest.fixture(scope="module")
def whole_greedy(tiny_engine, tokenizer):
    """Every row's greedy reply of the whole budget, in one call."""
    out = vLLMWrapper(
        tiny_engine, tokenizer, generate_kwargs={"max_new_tokens": BUDGET, "do_sample": False}
    )(_batch())
    prompt = out["tokens"].as_list("prompt")[LONG_ROW]
    assert len(prompt) > 128, "fixture: the long prompt must fill a prefix-cache block"
    return out


def test_greedy_segments_make_the_whole_greedy_reply(tiny_engine, tokenizer, whole_greedy):
    """Greedy replies resumed every 5 tokens are the replies of one call: each prefix is
    continued (prompt + prefix as the next request's prompt), not restarted, and a segment's
    ``max_tokens`` is what is left of the budget."""
    segmented = vLLMWrapper(
        tiny_engine,
        tokenizer,
        generate_kwargs={"max_new_tokens": BUDGET, "do_sample": False},
        segment_tokens=5,
    )
    outputs, boundaries = resume_until_done(segmented, _batch())
    expected = whole_greedy["tokens"].as_list("response")
    assert all(len(reply) == BUDGET for reply in expected)  # the random model never ends
    assert boundaries == [[0, 5, 10]] * len(expected)  # 5 + 5 + the 2 left of the budget
    for row, out in enumerate(outputs):
        assert torch.equal(out["tokens"].response, expected[row]), f"row {row}"
        assert out["text"].full == out["text"].prompt + out["text"].response
        assert not bool(out[PARTIAL_KEY])
    assert_close_rows(
        whole_greedy["log_probs"].as_list("response"),
        [out["log_probs"].response for out in outputs],
    )


def test_rows_resumed_from_prefixes_of_any_length_share_one_call(
    tiny_engine, tokenizer, whole_greedy
):
    """One call with a fresh row and rows resumed 5, 10 and 11 tokens in: each continues its
    own reply, a row is cut at the budget, and a prefix keeps the log-probs it came with."""
    replies = whole_greedy["tokens"].as_list("response")
    lengths = [0, 5, 10, 11]
    marks = [-(row + 1) / 8 for row in range(len(lengths))]  # not what the model would give
    prefixes = [
        Prefix(replies[row][:length], torch.full((length,), marks[row]))
        for row, length in enumerate(lengths)
    ]
    policy = vLLMWrapper(
        tiny_engine,
        tokenizer,
        generate_kwargs={"max_new_tokens": BUDGET, "do_sample": False},
        segment_tokens=5,
    )
    out = policy(attach_prefixes(_batch(), prefixes))
    assert out[PARTIAL_KEY].tolist() == [True, True, False, False]
    sampled = whole_greedy["log_probs"].as_list("response")
    for row, length in enumerate(lengths):
        stop = min(length + 5, BUDGET)
        assert torch.equal(out["tokens"].as_list("response")[row], replies[row][:stop])
        log_probs = out["log_probs"].as_list("response")[row]
        assert (log_probs[:length] == marks[row]).all(), f"row {row}: the prefix was rescored"
        assert_close_rows([sampled[row][length:stop]], [log_probs[length:]])


def _reply_across_a_load(tiny_engine, tokenizer, before, after, tmp_path):
    """Replies sampled 4 tokens a segment, ``after``'s weights loaded into the engine (as the
    runtime pushes them: version and checksum) between the first and the second segment; the
    engine is given ``before``'s weights back at the end."""
    tiny_engine.weight_folder = str(tmp_path)
    policy = vLLMWrapper(
        tiny_engine,
        tokenizer,
        generate_kwargs={"max_new_tokens": BUDGET, "seed": 0},
        segment_tokens=4,
    )
    weights = after.state_dict()

    def push(call: int) -> None:
        if call == 1:
            policy.load_weights(weights.items(), version=1, checksum=weights_checksum(weights))
            assert tiny_engine.weight_version() == "1"

    try:
        outputs, boundaries = resume_until_done(policy, _batch(), between=push)
    finally:
        tiny_engine.load_weights(before.state_dict().items(), version=2)
    assert boundaries == [[0, 4, 8]] * len(outputs)
    scored = []
    for out in outputs:
        full, length = out["tokens"].full.tolist(), out["tokens"].response.numel()
        scores = [hf_log_probs(model, full)[-length:] for model in (before, after)]
        scored.append((out["log_probs"].response, *scores))
    return scored


def test_a_reply_across_a_weight_load_has_each_versions_log_probs(
    tiny_engine, tokenizer, tiny_hf, tmp_path
):
    """The first segment's tokens carry the old weights' log-probs, the rest the loaded
    weights': each part equals the trainer's forward of that version on the whole sequence."""
    after = perturbed(tiny_hf, 0.05, seed=1)
    for sampled, old, new in _reply_across_a_load(tiny_engine, tokenizer, tiny_hf, after, tmp_path):
        assert_close_rows([old[:4], new[4:]], [sampled[:4], sampled[4:]])
        # the load is visible: the new tokens are not the old weights' log-probs
        assert (sampled[4:] - old[4:]).abs().max() > 100 * ATOL


def test_control_a_stale_prefix_cache_would_be_caught(
    tiny_engine, tokenizer, tiny_hf, tmp_path, monkeypatch
):
    """The test above can see stale KV: with the engine's cache reset after the load skipped,
    the long prompt's first block is served from the old weights' cache and its reply's new
    tokens miss the loaded weights' log-probs; the short prompts (no full block) still match."""
    after = perturbed(tiny_hf, 0.05, seed=1)
    with monkeypatch.context() as patched:
        patched.setattr(tiny_engine, "reset_prefix_cache", lambda: None)
        scored = _reply_across_a_load(tiny_engine, tokenizer, tiny_hf, after, tmp_path)
    tiny_engine.reset_prefix_cache()  # the real one: the old weights' entries go
    for row, (sampled, _, new) in enumerate(scored):
        gap = (sampled[4:] - new[4:]).abs().max().item()
        if row == LONG_ROW:
            assert gap > 100 * ATOL, "the resumed long prompt did not hit the prefix cache"
        else:
            assert gap <= ATOL, f"row {row}"


def test_a_prefix_cache_vllm_keeps_is_an_error(tiny_engine, monkeypatch):
    """vLLM only warns when it keeps its prefix cache (requests holding blocks): after a
    weight load that would serve resumed replies stale KV, so the engine raises instead."""
    monkeypatch.setattr(tiny_engine.llm, "reset_prefix_cache", lambda: False)
    with pytest.raises(RuntimeError, match="could not drop its prefix cache"):
        tiny_engine.reset_prefix_cache()
