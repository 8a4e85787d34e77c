"""SFT losses: hand-computed NLL / MinorSFT / KL values, then SFTLoss on a tiny model's chats.

The hand-made batch (N=2, L=4): assistant tokens and their log-probs

    row 0: mask [F, T, T, F]  log_probs [pad, -1.0, -2.0, pad]
    row 1: mask [F, T, T, T]  log_probs [pad, -0.5, -1.5, -3.0]

Padded positions hold 1e4: any leak changes the result by orders of magnitude.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History
from llmrl.objectives import SFTLoss, sft_objective
from llmrl.policies import TransformersWrapper
from tests.support.chats import history_batch

PAD = 1e4
MASK = torch.tensor([[False, True, True, False], [False, True, True, True]])
LOG_PROBS = torch.tensor([[PAD, -1.0, -2.0, PAD], [PAD, -0.5, -1.5, -3.0]])
GAP = torch.tensor([[0.0, 2.0, -2.0, 0.0], [0.0, 1.0, 0.0, -1.0]])  # log_probs - ref
REF = LOG_PROBS - GAP
# Hand-computed values: a few fp32 ops (exp, log1p, means) on values <= 4.4, each rounding by
# <= eps * 4.4 = 5e-7: ATOL is > 10x that; a wrong mask, reduction or sign moves a result by
# O(0.1).
ATOL = 1e-5


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_nll_reductions():
    # per-token NLL: row 0 [1, 2] (sum 3), row 1 [0.5, 1.5, 3] (sum 5); 5 tokens
    out = sft_objective(LOG_PROBS, MASK)
    assert out.loss_sft.item() == pytest.approx(8 / 5, abs=ATOL)
    assert out.sft.item() == pytest.approx(8 / 5, abs=ATOL)
    assert out.minor_sft is None and out.kl_to_ref is None
    # small dyadic values: fp32 sums them exactly (approx's default rel=1e-6 is more than enough)
    assert sft_objective(LOG_PROBS, MASK, reduction="sum").loss_sft.item() == pytest.approx(8.0)
    per_row = sft_objective(LOG_PROBS, MASK, reduction="none").loss_sft
    assert per_row.tolist() == pytest.approx([3.0, 5.0])


def test_normalize_by_seq_length():
    # per-sequence means 3 / 2 = 1.5 and 5 / 3, then reduced over the sequences
    out = sft_objective(LOG_PROBS, MASK, normalize_by_seq_length=True)
    assert out.loss_sft.item() == pytest.approx((1.5 + 5 / 3) / 2, abs=ATOL)
    summed = sft_objective(LOG_PROBS, MASK, normalize_by_seq_length=True, reduction="sum")
    assert summed.loss_sft.item() == pytest.approx(1.5 + 5 / 3, abs=ATOL)
    per_row = sft_objective(LOG_PROBS, MASK, normalize_by_seq_length=True, reduction="none")
    assert per_row.loss_sft.tolist() == pytest.approx([1.5, 5 / 3], abs=ATOL)


def test_minor_sft():
    # -log_sigmoid(beta * gap) = softplus(-beta * gap), beta = 0.5, gaps [2, -2 | 1, 0, -1]:
    # 0.3132617 + 1.3132617 + 0.4740770 + 0.6931472 + 0.9740770 = 3.7678245
    gaps = [2.0, -2.0, 1.0, 0.0, -1.0]
    expected = sum(softplus(-0.5 * g) for g in gaps) / 5
    out = sft_objective(LOG_PROBS, MASK, loss_function="minor_sft", ref_log_probs=REF, beta=0.5)
    assert out.loss_sft.item() == pytest.approx(expected, abs=ATOL)
    assert out.minor_sft.item() == pytest.approx(expected, abs=ATOL)
    assert out.sft.item() == pytest.approx(8 / 5, abs=ATOL), "the NLL is still reported"
    normalized = sft_objective(
        LOG_PROBS,
        MASK,
        loss_function="minor_sft",
        ref_log_probs=REF,
        beta=0.5,
        normalize_by_seq_length=True,
    )
    row0 = (softplus(-1.0) + softplus(1.0)) / 2
    row1 = (softplus(-0.5) + softplus(0.0) + softplus(0.5)) / 3
    assert normalized.loss_sft.item() == pytest.approx((row0 + row1) / 2, abs=ATOL)


def test_kl_to_ref():
    # k3(d) = e^d - 1 - d for d = ref - log_probs = -gap:
    # 1.1353353 + 4.3890561 + 0.3678794 + 0 + 0.7182818 = 6.6105526
    kl = [math.exp(d) - 1 - d for d in (-2.0, 2.0, -1.0, 0.0, 1.0)]
    out = sft_objective(LOG_PROBS, MASK, ref_log_probs=REF, kl_to_ref_coeff=0.1)
    assert out.kl_to_ref.item() == pytest.approx(sum(kl) / 5, abs=ATOL)
    assert out.loss_kl_to_ref.item() == pytest.approx(0.1 * sum(kl) / 5, abs=ATOL)
    assert out.total().item() == pytest.approx(8 / 5 + 0.1 * sum(kl) / 5, abs=ATOL)
    # without a coefficient the KL is reported but not added
    out = sft_objective(LOG_PROBS, MASK, ref_log_probs=REF)
    assert out.loss_kl_to_ref.item() == 0.0 and out.kl_to_ref.item() > 0


def test_gradients_are_zero_at_padding():
    log_probs = LOG_PROBS.clone().requires_grad_()
    out = sft_objective(
        log_probs, MASK, loss_function="minor_sft", ref_log_probs=REF, kl_to_ref_coeff=0.1
    )
    out.loss.backward()
    assert torch.isfinite(log_probs.grad).all()
    assert (log_probs.grad[~MASK] == 0).all()
    assert (log_probs.grad[MASK] != 0).all()


def test_rows_without_assistant_tokens_are_named():
    mask = MASK.clone()
    mask[1] = False
    with pytest.raises(ValueError, match=r"batch rows \[1\] have no assistant tokens"):
        sft_objective(LOG_PROBS, mask)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_function": "dpo"}, "options: ['sft', 'minor_sft']"),
        ({"reduction": "max"}, "options: ['mean', 'sum', 'none']"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"kl_to_ref_coeff": -1.0}, "kl_to_ref_coeff must be >= 0"),
        ({"loss_function": "minor_sft"}, "need ref_log_probs"),
        ({"kl_to_ref_coeff": 0.1}, "need ref_log_probs"),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ValueError) as error:
        sft_objective(LOG_PROBS, MASK, **kwargs)
    assert message in str(error.value)


# ----------------------------------------------------------------- SFTLoss on a tiny model
CHATS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Colour?"},
        {"role": "assistant", "content": "Blue, like the sky."},
    ],
]


@pytest.fixture
def chats():
    history = History.from_chats(CHATS)
    return TensorDict({"history": ChatHistory(full=history, batch_size=[2])}, batch_size=[2])


@pytest.fixture
def actor(tiny, tokenizer):
    yield TransformersWrapper(tiny, tokenizer, input_mode="history")
    tiny.zero_grad(set_to_none=True)


def test_sft_loss_on_chats_matches_a_direct_computation(actor, chats, tiny, tokenizer):
    out = SFTLoss(actor)(chats)
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny.parameters())
    # by hand: the model's log-prob of each assistant token (content and end-of-turn of every
    # assistant turn), averaged over those tokens
    tokens = History.from_chats(CHATS).apply_chat_template(tokenizer)
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, assistant in zip(
            tokens.as_list("input_ids"), tokens.as_list("assistant_mask"), strict=True
        ):
            log_p = tiny(input_ids=ids.unsqueeze(0)).logits[0, :-1].log_softmax(-1)
            token_log_p = log_p.gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
            total -= token_log_p[assistant[1:].bool()].sum().item()
            count += int(assistant[1:].sum())
    assert count > 2 * len(CHATS)  # both turns of chat 1 count
    # batched, padded scoring against one sequence at a time: each log-prob within
    # log_prob_atol (~3e-4, sums over the vocabulary in another order) of a mean NLL of ~11:
    # rel=1e-4 allows 1e-3 (measured 0); a wrong mask or shift moves it by >= 0.01
    assert out.loss_sft.item() == pytest.approx(total / count, rel=1e-4)
    assert out.loss_sft.item() > 0


def test_minor_sft_and_kl_with_the_same_model_as_reference(actor, chats):
    with torch.no_grad():
        reference = actor.get_new_version(generate=False)(chats)["log_probs"]
    chats["ref_log_probs"] = reference
    out = SFTLoss(actor, loss_function="minor_sft", beta=0.5, kl_to_ref_coeff=0.1)(chats)
    # log_probs == ref: every token costs -log_sigmoid(0) = log 2, the KL is 0 (the same
    # scorer on the same batch: bitwise equal log-probs, so log 2 and 0 up to ~1 ulp)
    assert out.loss_sft.item() == pytest.approx(math.log(2), abs=1e-5)
    assert out.kl_to_ref.item() == pytest.approx(0.0, abs=1e-5)
    out.loss.backward()


def test_sft_loss_on_sampled_conversations(tiny, tokenizer):
    sampler = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 4, "seed": 0})
    rollout = sampler(history_batch())
    out = SFTLoss(sampler, normalize_by_seq_length=True, reduction="none")(rollout)
    assert out.loss_sft.shape == (3,) and torch.isfinite(out.loss_sft).all()
    tiny.zero_grad(set_to_none=True)


def test_sft_loss_in_tokens_mode_trains_on_earlier_assistant_turns(tiny, tokenizer):
    sampler = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 4, "seed": 0})
    rollout = sampler(history_batch())
    loss = SFTLoss(sampler.get_new_version(input_mode="tokens"), reduction="none")
    per_row = loss(rollout).loss_sft.detach()
    # per-row NLL sums over masks.assistant (the sampled reply, plus the earlier assistant turn
    # of the multi-turn prompt 2), from the sampler's own (sampling == scoring) log-probs
    for row in range(3):
        prompt_len = len(rollout["tokens"].as_list("prompt")[row])
        prompt_turns = rollout["masks"].as_list("assistant")[row][:prompt_len]
        assert prompt_turns.any() == (row == 2)
        if row < 2:
            # <= 4 tokens' sampling vs scoring gaps, each <= log_prob_atol (~3e-4), summed
            # independently: ~2 of it, 6.6e-4 <= 1e-3 (measured 0)
            expected = -rollout["log_probs"].as_list("response")[row].sum()
            assert per_row[row].item() == pytest.approx(expected.item(), abs=1e-3)
    assert per_row[2] > -rollout["log_probs"].as_list("response")[2].sum()
    tiny.zero_grad(set_to_none=True)


def test_sft_loss_errors(actor, chats):
    with pytest.raises(KeyError, match="'ref_log_probs'"):
        SFTLoss(actor, loss_function="minor_sft")(chats)
    with pytest.raises(ValueError, match="options"):
        SFTLoss(actor, reduction="avg")
    no_answer = History.from_chats([CHATS[0], [{"role": "user", "content": "Hello?"}]])
    td = TensorDict({"history": ChatHistory(full=no_answer, batch_size=[2])}, batch_size=[2])
    with pytest.raises(ValueError, match=r"batch rows \[1\]"):
        SFTLoss(actor)(td)
    with pytest.raises(ValueError, match="reshape"):
        SFTLoss(actor)(chats.unsqueeze(0))


def test_tokenizer_templates_chats_and_the_actor_is_left_alone(actor, tokenizer):
    loss = SFTLoss(actor, tokenizer=tokenizer)
    assert loss.actor.tokenizer is tokenizer and not loss.actor.generate and loss.actor.pad_output
    assert actor.generate and not actor.pad_output, "the given actor keeps its settings"
