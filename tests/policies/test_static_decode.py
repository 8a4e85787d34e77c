"""The compiled static-KV decode: the same greedy tokens and log-probs as plain ``generate``."""

from __future__ import annotations

import logging

import pytest
import torch

from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from llmrl.policies.static_decode import resolve_compile_decode, static_cache_length
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def model(tokenizer):
    """A tiny model of this module's own: compiling attaches a compiled step to it."""
    return tiny_model(tokenizer, seed=3).eval()


def _responses(policy: TransformersWrapper) -> tuple[list[list[int]], list[torch.Tensor], list]:
    """(response tokens, their log-probs, the full sequences)."""
    out = policy(history_batch()).reshape(-1)
    tokens = [t.tolist() for t in out["tokens"].as_list("response")]
    return tokens, out["log_probs"].as_list("response"), out["tokens"].as_list("full")


def _assert_same(plain: tuple, compiled: tuple, model: torch.nn.Module) -> None:
    assert compiled[0] == plain[0]
    # the compiled step's fused kernels against eager ones: the same fp32 sums in another
    # order, the longest over the vocabulary (log_prob_atol of the sequences' logits)
    with torch.no_grad():
        max_logit = max(max_abs(model(input_ids=s[None]).logits) for s in plain[2])
    atol = log_prob_atol(max_logit, model.config.vocab_size)
    for ours, theirs in zip(compiled[1], plain[1], strict=True):
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


@pytest.mark.parametrize(
    ("prompt_width", "new_tokens", "length"),
    [(40, 24, 64), (40, 64, 128), (64, 64, 128), (65, 64, 192), (1, 1, 64)],
)
def test_cache_length_is_rounded_up_to_the_bucket(prompt_width, new_tokens, length):
    assert static_cache_length(prompt_width, new_tokens) == length


def test_by_default_the_decode_is_compiled_on_cuda_only():
    assert resolve_compile_decode(None, torch.device("cuda", 0))
    assert not resolve_compile_decode(None, torch.device("cpu"))
    assert not resolve_compile_decode(False, torch.device("cuda"))
    assert resolve_compile_decode(True, torch.device("cpu"))


@pytest.mark.parametrize("samples", [1, 3], ids=["distinct-prompts", "shared-prompt-prefix"])
def test_compiled_decode_matches_plain_generate(model, tokenizer, samples, caplog):
    plain = TransformersWrapper(model, tokenizer, generate_kwargs=GREEDY, num_samples=samples)
    compiled = plain.get_new_version(compile_decode=True)
    assert compiled.compile_decode and not plain.compile_decode
    reference = _responses(plain)
    assert max(len(t) for t in reference[0]) == GREEDY["max_new_tokens"]
    assert compiled.compile_seconds is None
    with caplog.at_level(logging.INFO, logger="llmrl.policies.transformers_wrapper"):
        _assert_same(reference, _responses(compiled), model)
        # transformers keeps the compiled step on the model: proof the compiled path ran
        assert getattr(model, "_compiled_call", None) is not None
        _assert_same(reference, _responses(compiled), model)  # the compiled step, reused
    assert compiled.compile_seconds > 0
    assert [r.getMessage() for r in caplog.records if "compiled decode" in r.getMessage()] == [
        f"compiled decode: first call took {compiled.compile_seconds:.1f} s, compiling the "
        "decode step included"
    ]


def test_compiled_seeded_sampling_repeats(model, tokenizer):
    """Sampling through the compiled step draws from the call's own generator (same shapes as
    the greedy calls above: no new compile)."""
    kwargs = {**GREEDY, "do_sample": True, "seed": 5}
    policy = TransformersWrapper(model, tokenizer, generate_kwargs=kwargs, compile_decode=True)
    state = torch.get_rng_state()
    first = _responses(policy)
    _assert_same(first, _responses(policy), model)
    assert _responses(policy.get_new_version(generate_kwargs={**kwargs, "seed": 6}))[0] != first[0]
    assert torch.equal(torch.get_rng_state(), state)


def test_compiled_decode_reads_updated_weights(model, tokenizer):
    """A weight sync copies into the parameters in place; the compiled step must see it."""
    plain = TransformersWrapper(model, tokenizer, generate_kwargs=GREEDY)
    compiled = TransformersWrapper(model, tokenizer, generate_kwargs=GREEDY, compile_decode=True)
    before = _responses(compiled)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    after = _responses(compiled)
    assert after[0] != before[0], "the update should change the greedy responses"
    _assert_same(_responses(plain), after, model)
