"""Decoding on CUDA (llmrl/policies/transformers_wrapper.py): the compiled static-KV decode (the
CUDA default) gives the eager decode's greedy tokens, and in bfloat16 the log-probs recorded
while sampling match the scoring forward's within a bound derived from bfloat16's rounding."""

from __future__ import annotations

import pytest
import torch

from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from tests.gpu.conftest import requires_cuda
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs

pytestmark = [pytest.mark.gpu, requires_cuda]

BF16_UNIT_ROUNDOFF = 2.0**-8  # bfloat16 keeps 8 significant bits: relative rounding <= 2^-8


def _responses(policy: TransformersWrapper):
    out = policy(history_batch()).reshape(-1)
    return out, [t.tolist() for t in out["tokens"].as_list("response")]


def test_compiled_greedy_decode_gives_the_eager_tokens(tokenizer):
    model = tiny_model(tokenizer, seed=3).cuda()
    greedy = {"max_new_tokens": 24, "do_sample": False}
    eager = TransformersWrapper(model, tokenizer, generate_kwargs=greedy, compile_decode=False)
    default = TransformersWrapper(model, tokenizer, generate_kwargs=greedy)  # None: compiled
    eager_out, eager_tokens = _responses(eager)
    # fp32 (no TF32): the compiled step's fused kernels against eager ones are the same sums in
    # another order, the longest over the vocabulary (log_prob_atol of the sequences' logits)
    with torch.no_grad():
        max_logit = max(
            max_abs(model(input_ids=s[None].to(model.device)).logits)
            for s in eager_out["tokens"].as_list("full")
        )
    atol = log_prob_atol(max_logit, model.config.vocab_size)
    for _ in range(2):  # the first call compiles, the second reuses the compiled step
        out, tokens = _responses(default)
        assert tokens == eager_tokens
        for ours, theirs in zip(
            out["log_probs"].as_list("response"),
            eager_out["log_probs"].as_list("response"),
            strict=True,
        ):
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    assert default.compile_seconds is not None and default.compile_seconds > 0


def test_bfloat16_sampling_log_probs_match_scoring_within_the_rounding_bound(tokenizer):
    model = tiny_model(tokenizer, seed=2, dtype=torch.bfloat16).cuda()
    layers = model.config.num_hidden_layers
    policy = TransformersWrapper(
        model, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 48, "seed": 0}
    )
    out, _ = _responses(policy)
    scored = policy.get_new_version(generate=False, input_mode="tokens")(out)
    sampled = torch.cat(out["log_probs"].as_list("response"))
    rescored = torch.cat(scored["log_probs"].as_list("response")).detach()
    # sampled outputs are shipped between processes, so they come back on the CPU; scoring is the
    # trainer's forward (its loss backpropagates), so it stays on the model's device
    assert sampled.device.type == "cpu" and rescored.device == model.device
    rescored = rescored.cpu()
    with torch.no_grad():  # the largest logit magnitude the model produces on these tokens
        ids = out["tokens"].as_list("full")[0].unsqueeze(0).cuda()
        max_logit = float(model(input_ids=ids).logits.float().abs().max())
    # Sampling (one query at a time against the KV cache, compiled) and scoring (every position
    # at once) run the same bf16 network with different kernels, so their results differ only
    # by rounding. A bf16 result is off by at most u = 2^-8 of its size; the logits pass about
    # 2 such roundings a layer (attention and MLP outputs, added to the residual) plus the
    # output layer's, so |dz| <= (2 * layers + 1) * u * max|z| for every logit. A log-prob
    # z_t - logsumexp(z) moves by at most |dz_t| + max_j |dz_j|: twice that.
    bound = 2 * (2 * layers + 1) * BF16_UNIT_ROUNDOFF * max_logit
    diff = (sampled - rescored).abs()
    print(f"bf16 sampling vs scoring: max diff {float(diff.max()):.3g}, bound {bound:.3g}")
    assert float(diff.max()) <= bound, f"max diff {float(diff.max()):.3g} > bound {bound:.3g}"
    assert sampled.numel() == rescored.numel() > 0
