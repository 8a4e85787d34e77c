"""GRPOLoss on a tiny model's rollout: the batch it reads, its masking strategies and extra
terms, each against the value the math gives when the weights have not moved (ratio 1).

Hand-computed values of the math itself: test_grpo_objective.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.envs.transforms import RetrieveLogProb
from llmrl.objectives import GRPOLoss
from llmrl.objectives.token_level import masked_mean, scatter_rows, token_entropy
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs, summation_atol


def _log_prob_atol(tiny, rollout) -> float:
    """How far two fp32 computations of a log-prob of the rollout's tokens (the sampler's
    decode, a training pass, another batch layout or chunking) may differ: the same sums in
    another order, the longest over the vocabulary (``log_prob_atol``, ~3e-4 here; measured
    gaps are ~1 ulp of |log p| ~ 10, 1e-6). A loss term -A r moves by |A| times that."""
    with torch.no_grad():
        sequences = rollout["tokens"].as_list("full")
        max_logit = max(max_abs(tiny(input_ids=s[None]).logits) for s in sequences)
    return log_prob_atol(max_logit, tiny.config.vocab_size)


def test_loss_forward_backward_first_step(sampler, rollout, tiny):
    out = GRPOLoss(sampler)(rollout)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in tiny.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    # unchanged weights: ratio == 1, so nothing is clipped and old == current. r = exp(d), d
    # the gap between sampling (decode) and training (one pass) log-probs, d <= _log_prob_atol
    # (~3e-4): kl ~ d^2 / 2 and 1 - ESS ~ var(d) are ~1e-7 at most (measured 1e-13, 1e-7)
    atol = _log_prob_atol(tiny, rollout)
    assert out.clip_fraction.item() == 0.0
    assert out.kl_approx.item() == pytest.approx(0.0, abs=1e-4)
    assert out.ESS.item() == pytest.approx(1.0, abs=1e-4)
    # with r == 1 the token-mean objective is -mean(A) over the response tokens, to max|A| d
    lengths = torch.tensor([len(r) for r in rollout["tokens"].as_list("response")])
    expected = -(rollout["advantage"] * lengths).sum() / lengths.sum()
    loss_atol = max_abs(rollout["advantage"]) * atol
    assert out.loss_objective.item() == pytest.approx(expected.item(), abs=loss_atol)


def test_loss_only_touches_response_tokens_with_sft_masking(sampler, rollout, tiny):
    out = GRPOLoss(sampler, aggregation="none")(rollout)
    scored = sampler.get_new_version(generate=False, input_mode="tokens", pad_output=True)(rollout)
    masks = scored["masks"]
    per_token = out.loss_objective.detach()
    prompt_width = masks.prompt.shape[1]
    assert (per_token[:, :prompt_width] == 0).all()
    response = per_token[:, prompt_width:]
    assert (response[~masks.response] == 0).all()
    # ratio == 1: each response token's loss is -A of its row, to |A| d (d the sampling vs
    # training log-prob gap, see _log_prob_atol; measured 1.9e-6 with |A| = 2)
    expected = -rollout["advantage"].unsqueeze(1).expand_as(response)
    atol = max_abs(rollout["advantage"]) * _log_prob_atol(tiny, rollout)
    got, want = response[masks.response], expected[masks.response]
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_rlhf_masking_trains_earlier_assistant_turns(sampler, rollout, tiny):
    loss = GRPOLoss(sampler, aggregation="none", masking_strategy="rlhf")
    scorer = sampler.get_new_version(generate=False, input_mode="tokens")
    with torch.no_grad():
        rescored = scorer(rollout)
    scored_masks = scorer.get_new_version(pad_output=True)(rollout)["masks"]
    prompt_width = scored_masks.prompt.shape[1]
    earlier_turns = scored_masks.assistant[:, :prompt_width]
    assert earlier_turns[4:].any() and not earlier_turns[:4].any()  # prompt 2 is multi-turn
    expected = -rollout["advantage"].unsqueeze(1).expand(-1, prompt_width)
    # sampling log-probs cover the response only: earlier assistant turns are trained on all
    # the same, anchored on the current log-probs (ratio exp(x - x) = 1 exactly: -A, measured 0)
    without = loss(rollout).loss_objective.detach()[:, :prompt_width]
    assert torch.allclose(without[earlier_turns], expected[earlier_turns], atol=1e-6)
    assert (without[~earlier_turns] == 0).all()
    # old log-probs with a prompt part: their anchor is those log-probs, rescored by another
    # forward than the loss's: ratio exp(d), -A to |A| _log_prob_atol (measured 0 here)
    with_prompt = rollout.clone(False)
    with_prompt["log_probs"] = rescored["log_probs"]
    per_token = loss(with_prompt).loss_objective.detach()[:, :prompt_width]
    atol = max_abs(rollout["advantage"]) * _log_prob_atol(tiny, rollout)
    got, want = per_token[earlier_turns], expected[earlier_turns]
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert (per_token[~earlier_turns] == 0).all()


def test_kl_to_ref_entropy_and_inference_terms(sampler, rollout):
    RetrieveLogProb(sampler).on_step(rollout)  # the reference is the same model: KL ~ 0
    loss = GRPOLoss(
        sampler,
        masking_strategy="rlhf",
        kl_to_ref_coeff=0.1,
        kl_to_inference_coeff=0.1,
        entropy_coeff=0.01,
    )
    out = loss(rollout)
    # KLs between log-probs of the same model differing by a rounding gap d <= _log_prob_atol
    # (~3e-4): k3 ~ d^2 / 2 <= 1e-7 (measured <= 1e-14); the entropy term is one multiply
    assert out.kl_to_ref.item() == pytest.approx(0.0, abs=1e-4)
    assert out.loss_kl_to_inference.item() == pytest.approx(0.0, abs=1e-5)
    assert 0 < out.entropy.item() < math.log(len(sampler.tokenizer)) + 1e-3
    assert out.loss_entropy.item() == pytest.approx(-0.01 * out.entropy.item(), rel=1e-5)
    out.loss.backward()


@pytest.mark.parametrize("masking_strategy", ["sft", "rlhf"])
def test_entropy_bonus_equals_entropy_of_full_logits(sampler, rollout, tiny, masking_strategy):
    """The entropy GRPOLoss gets from chunked scoring (no logits) gives the loss and gradients
    of the entropy computed from full logits (``token_entropy``), as the loss did before."""
    actor = sampler.get_new_version(log_prob_chunk_size=4)  # several chunks per batch
    coeff = 0.05
    tiny.zero_grad(set_to_none=True)
    out = GRPOLoss(actor, entropy_coeff=coeff, masking_strategy=masking_strategy)(rollout)
    out.loss.backward()
    grads = [p.grad.clone() for p in tiny.parameters()]

    tiny.zero_grad(set_to_none=True)
    plain = GRPOLoss(sampler, masking_strategy=masking_strategy)
    without = plain(rollout)
    scored = plain.actor.get_new_version(return_logits=True, score_responses_only=False)(rollout)
    masks = scored["masks"]
    per_row = token_entropy(scored["logits"])  # right-padded rows
    lengths = masks.full.sum(1).tolist()
    entropy = scatter_rows([row[:n] for row, n in zip(per_row, lengths, strict=True)], masks.full)
    mask = plain._mask(masks)
    expected = without.loss - coeff * masked_mean(entropy, mask)
    expected.backward()
    # Chunked lse - sum p z against full-logits -sum p log p: V-term sums with partial sums up
    # to the entropy (~log V). The loss adds coeff times that, and |A| times the log-probs'
    # rounding (log_prob_atol). Every gradient flows through grad_logits @ W, a V-term sum,
    # each tensor at its own magnitude.
    vocab = tiny.config.vocab_size
    entropy_atol = summation_atol(max_abs(per_row), vocab)
    lp_atol = log_prob_atol(max_abs(scored["logits"]), vocab)
    loss_atol = coeff * entropy_atol + max_abs(rollout["advantage"]) * lp_atol
    want_entropy = masked_mean(entropy, mask).item()
    assert out.entropy.item() == pytest.approx(want_entropy, abs=entropy_atol)
    assert out.loss.item() == pytest.approx(expected.item(), abs=loss_atol)
    for got, want in zip(grads, [p.grad for p in tiny.parameters()], strict=True):
        torch.testing.assert_close(got, want, atol=summation_atol(max_abs(want), vocab), rtol=0)


def test_padded_batch_gives_the_same_loss(sampler, rollout):
    padded = sampler.get_new_version(pad_output=True)(history_batch()).reshape(-1)
    assert padded["tokens"].is_padded
    assert [t.tolist() for t in padded["tokens"].unpad(padded["masks"]).as_list("full")] == [
        t.tolist() for t in rollout["tokens"].as_list("full")
    ], "same seed, same samples"
    padded["advantage"] = rollout["advantage"]
    loss = GRPOLoss(sampler, aggregation="prompt_mean", kl_to_inference_coeff=0.1)
    ragged_out, padded_out = loss(rollout), loss(padded)
    # the ragged batch is padded to the same layout for the forward: bitwise equal (measured 0;
    # values ~1, so 1e-6 is ~8 ulp)
    for name in ("loss_objective", "loss_kl_to_inference", "kl_approx", "ESS"):
        assert padded_out.get(name).item() == pytest.approx(
            ragged_out.get(name).item(), abs=1e-6
        ), name


def test_truncated_importance_sampling_forward(sampler, rollout, tiny):
    plain = GRPOLoss(sampler)(rollout)
    # the anchor is the current log-probs (detached) and w = min(exp(current - sampling), cap)
    # ~ 1 on the first step: the same loss (to max|A| d, d the sampling vs training log-prob
    # gap, see _log_prob_atol; measured 0), and gradients flow
    loss_atol = max_abs(rollout["advantage"]) * _log_prob_atol(tiny, rollout)
    tis = GRPOLoss(sampler, tis_cap=2.0)(rollout)
    assert tis.loss_objective.item() == pytest.approx(plain.loss_objective.item(), abs=loss_atol)
    assert tis.loss_objective.requires_grad
    # an explicit anchor: the training model's log-probs of the sampling policy
    anchored = rollout.clone(False)
    anchored["old_log_probs"] = rollout["log_probs"]
    out = GRPOLoss(sampler, tis_cap=2.0, old_log_probs_key="old_log_probs")(anchored)
    assert out.loss_objective.item() == pytest.approx(plain.loss_objective.item(), abs=loss_atol)


def test_loss_validation(sampler, rollout):
    with pytest.raises(ValueError, match=r"options: \['sft', 'rlhf', 'generic'\]"):
        GRPOLoss(sampler, masking_strategy="assistant")
    with pytest.raises(ValueError, match="options: "):
        GRPOLoss(sampler, aggregation="seq_mean")
    with pytest.raises(ValueError, match="needs max_length_norm"):
        GRPOLoss(sampler, aggregation="sum_norm")
    with pytest.raises(ValueError, match="clip_epsilon must be >= 0"):
        GRPOLoss(sampler, clip_epsilon=(-0.1, 0.2))
    for missing in ("advantage", "log_probs", "tokens"):
        with pytest.raises(KeyError, match=f"'{missing}'"):
            GRPOLoss(sampler)(rollout.exclude(missing))
    with pytest.raises(KeyError, match="'ref_log_probs'"):
        GRPOLoss(sampler, kl_to_ref_coeff=0.1)(rollout)
    with pytest.raises(ValueError, match="reshape"):
        GRPOLoss(sampler)(rollout.reshape(3, 2))


def test_response_only_scoring_gives_the_same_loss_and_gradients(sampler, rollout, tiny):
    """The loss scores responses only under "sft" masking; the full pass gives the same."""
    fast = GRPOLoss(sampler)
    assert fast.actor.score_responses_only
    slow = GRPOLoss(sampler)
    slow.actor = slow.actor.get_new_version(score_responses_only=False)
    results = []
    for loss in (fast, slow):
        tiny.zero_grad(set_to_none=True)
        out = loss(rollout)
        out.loss.backward()
        results.append((out.loss.item(), [p.grad.clone() for p in tiny.parameters()]))
    # The output layer runs on fewer positions: the same sums, blocked differently. The loss
    # moves by |A| times the log-probs' rounding (_log_prob_atol); every gradient flows
    # through grad_logits @ W, a V-term sum, each tensor at its own magnitude.
    vocab = tiny.config.vocab_size
    loss_atol = max_abs(rollout["advantage"]) * _log_prob_atol(tiny, rollout)
    assert results[0][0] == pytest.approx(results[1][0], abs=loss_atol)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=summation_atol(max_abs(b), vocab), rtol=0)
    assert not GRPOLoss(sampler, masking_strategy="rlhf").actor.score_responses_only
