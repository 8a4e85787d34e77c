"""On-policy distillation in the GRPO losses: the per-token advantage and its diagnostics against
hand-computed values, the loss and its gradient by hand on a two-word vocabulary at ratio 1,
and GRPOLoss with ``distillation`` on a tiny model's rollout scored by another tiny model (the
teacher): the value the math gives, the errors that name what is wrong, packed == padded, and
bit-for-bit the loss without distillation when the teacher adds nothing."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from llmrl.config.model_signals import DistillationSettings
from llmrl.data import LogProbs
from llmrl.envs.transforms import RetrieveLogProb
from llmrl.objectives import CISPOLoss, GRPOLoss, GSPOLoss, cispo_term, grpo_objective, gspo_term
from llmrl.objectives.distillation import reverse_kl, teacher_signal
from llmrl.objectives.policy_gradient import clipped_token_term
from llmrl.objectives.token_level import (
    align_to_layout,
    field_rows,
    prediction_mask,
    response_columns,
)
from llmrl.policies import TransformersWrapper
from tests.tolerances import log_prob_atol, max_abs, summation_atol

# row 0: 3 response tokens, task advantage A = 1.0; row 1: 2 tokens (then padding), A = -2.0
ADVANTAGE = torch.tensor([1.0, -2.0])
TEACHER = torch.tensor([[-1.0, -0.5, -3.0], [-2.0, -0.25, 9.0]])
SAMPLER = torch.tensor([[-2.0, -0.5, -1.0], [-1.0, -1.25, 9.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
# gaps teacher - sampler: [1.0, 0.0, -2.0] and [-1.0, 1.0, (pad)]


@pytest.mark.parametrize(
    ("coeff", "task_weight", "expected"),
    [
        # 0.25 * A + 0.5 * gap: row 0 0.25 + [0.5, 0.0, -1.0]; row 1 -0.5 + [-0.5, 0.5]
        (0.5, 0.25, [[0.75, 0.25, -0.75], [-1.0, 0.0, 0.0]]),
        # pure distillation: the gaps alone, times coeff 2
        (2.0, 0.0, [[2.0, 0.0, -4.0], [-2.0, 2.0, 0.0]]),
        # coeff doubled from the first case: only the teacher's part doubles
        (1.0, 0.25, [[1.25, 0.25, -1.75], [-1.5, 0.5, 0.0]]),
        # task_weight 1: A itself plus the gaps; row 1 -2 + [-1, 1]
        (1.0, 1.0, [[2.0, 1.0, -1.0], [-3.0, -1.0, 0.0]]),
    ],
)
def test_the_advantage_of_each_token_by_hand(coeff, task_weight, expected):
    got = teacher_signal(ADVANTAGE, TEACHER, SAMPLER, MASK, coeff=coeff, task_weight=task_weight)
    assert got.advantage.tolist() == expected  # padding gets 0 whatever its values (9.0 here)
    column = teacher_signal(  # an [N, 1] advantage, as the estimators may write it
        ADVANTAGE[:, None], TEACHER, SAMPLER, MASK, coeff=coeff, task_weight=task_weight
    )
    assert column.advantage.tolist() == expected


def test_the_diagnostics_by_hand():
    signal = teacher_signal(ADVANTAGE, TEACHER, SAMPLER, MASK, coeff=0.5, task_weight=0.25)
    # reverse KL: mean of sampler - teacher over the 5 tokens: (-1 + 0 + 2 + 1 - 1) / 5
    assert signal.reverse_kl.item() == pytest.approx(0.2)
    assert reverse_kl(TEACHER, SAMPLER, MASK).item() == pytest.approx(0.2)
    # teacher's mean log-prob: (-1 - 0.5 - 3 - 2 - 0.25) / 5
    assert signal.teacher_logprob_mean.item() == pytest.approx(-6.75 / 5)
    # sizes: teacher 0.5 * (1 + 0 + 2 + 1 + 1) = 2.5; task 0.25 * (1 * 3 + 2 * 2) = 1.75
    assert signal.teacher_share.item() == pytest.approx(2.5 / (2.5 + 1.75))
    pure = teacher_signal(ADVANTAGE, TEACHER, SAMPLER, MASK, coeff=1.0, task_weight=0.0)
    assert pure.teacher_share.item() == 1.0
    nothing = teacher_signal(ADVANTAGE, TEACHER, TEACHER, MASK, coeff=1.0, task_weight=0.0)
    assert nothing.teacher_share.item() == 0.0 and nothing.reverse_kl.item() == 0.0
    with pytest.raises(ValueError, match="coeff > 0"):
        teacher_signal(ADVANTAGE, TEACHER, SAMPLER, MASK, coeff=0.0, task_weight=1.0)
    with pytest.raises(ValueError, match="one advantage per row"):
        teacher_signal(ADVANTAGE[:1], TEACHER, SAMPLER, MASK, coeff=1.0, task_weight=1.0)


@pytest.mark.parametrize("term", [clipped_token_term, gspo_term, cispo_term])
def test_loss_and_gradient_by_hand_at_ratio_one(term):
    """Two-word vocabulary, every logit 0: p = 1/2 for each word, log pi = -log 2. At ratio 1
    every variant's gradient is REINFORCE on the token advantage under token_mean over the 5
    tokens: d loss / d z_v = -(A_t / 5) (1[v = y_t] - 1/2), i.e. -A_t / 10 on the sampled
    word and +A_t / 10 on the other."""
    logits = torch.zeros(2, 3, 2, requires_grad=True)
    sampled = torch.tensor([[0, 1, 0], [1, 1, 0]])
    log_probs = logits.log_softmax(-1).gather(-1, sampled[..., None]).squeeze(-1)
    advantage = teacher_signal(ADVANTAGE, TEACHER, SAMPLER, MASK, coeff=0.5, task_weight=0.25)
    advantage = advantage.advantage
    # = [[0.75, 0.25, -0.75], [-1.0, 0.0, 0.0]], summing to -0.75 over the 5 tokens
    out = grpo_objective(log_probs, log_probs.detach(), advantage, MASK, policy_gradient=term)
    out.loss.backward()
    if term is cispo_term:  # -mean(A_t log pi_t) = -(-0.75 * -log 2) / 5
        assert out.loss.item() == pytest.approx(-0.75 * math.log(2) / 5)
    else:  # -mean(A_t * 1)
        assert out.loss.item() == pytest.approx(0.75 / 5)
    on_sampled = torch.tensor([[-0.075, -0.025, 0.075], [0.1, 0.0, 0.0]])  # -A_t / 10
    sign = 2 * torch.nn.functional.one_hot(sampled, 2) - 1  # +1 on the sampled word, -1 else
    expected = on_sampled[..., None] * sign
    torch.testing.assert_close(logits.grad, expected, atol=1e-7, rtol=0)


def test_gspo_clips_each_token_by_the_sign_of_its_own_advantage():
    """One sequence, ratio s = e^0.1 > 1 + eps_high: its tokens favoured by the teacher (A > 0)
    are clipped, with no gradient; the one it disfavours (A < 0) keeps -A s."""
    log_probs = torch.full((1, 3), -1.0, requires_grad=True)
    old = torch.full((1, 3), -1.1)
    advantage = torch.tensor([[0.5, -1.0, 2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    term = gspo_term(log_probs, old, advantage, mask, (0.2, 0.05))
    assert term.clipped.tolist() == [[True, False, True]]
    term.loss.sum().backward()
    assert log_probs.grad[0].tolist() == pytest.approx([0.0, math.exp(0.1), 0.0])


@pytest.fixture(scope="module")
def teacher_policy(tokenizer):
    from llmrl.models import tiny_model

    return TransformersWrapper(tiny_model(tokenizer, seed=1), tokenizer)


@pytest.fixture
def distilled(rollout, teacher_policy):
    """The rollout with the teacher's log-probs of its tokens."""
    return RetrieveLogProb(teacher_policy, out_key="teacher_log_probs").on_step(rollout.clone())


@pytest.mark.parametrize("loss_class", [GRPOLoss, GSPOLoss, CISPOLoss])
def test_each_response_token_is_trained_on_its_teacher_gap_at_ratio_one(
    sampler, distilled, tiny, loss_class
):
    settings = DistillationSettings(coeff=0.5, task_weight=0.25)
    clip = {GRPOLoss: 0.2, GSPOLoss: (3e-4, 4e-4), CISPOLoss: (1.0, 0.28)}[loss_class]
    loss = loss_class(sampler, aggregation="none", clip_epsilon=clip, distillation=settings)
    out = loss(distilled)
    scored = sampler.get_new_version(generate=False, input_mode="tokens", pad_output=True)
    masks = scored(distilled)["masks"]
    prompt_width = masks.prompt.shape[1]
    response = out.loss_objective.detach()[:, prompt_width:]
    assert (out.loss_objective.detach()[:, :prompt_width] == 0).all()  # the prompt: no term
    teacher = field_rows(distilled["teacher_log_probs"], "response", distilled.get("masks", None))
    sampling = distilled["log_probs"].as_list("response")
    advantage = distilled["advantage"]
    with torch.no_grad():  # two fp32 computations of a log-prob differ by at most this
        max_logit = max(
            max_abs(tiny(input_ids=x[None]).logits) for x in distilled["tokens"].as_list("full")
        )
    gap_atol = log_prob_atol(max_logit, tiny.config.vocab_size)
    for row, (t, s) in enumerate(zip(teacher, sampling, strict=True)):
        # ratio 1 (weights unmoved): each token's loss is -(0.25 A_i + 0.5 (teacher - sampler))
        # for GRPO's clipped term and GSPO's (s_i = 1); CISPO's is that times log pi_t
        expected = -(0.25 * advantage[row] + 0.5 * (t - s))
        got = response[row][masks.response[row]]
        if loss_class is CISPOLoss:
            expected = expected * s
        # the loss's log-probs and the sampler's differ by gap_atol: -A r moves by |A| gap_atol
        # (GSPO's s_i is a mean of such ratios), CISPO's -A log pi by |A| gap_atol + |log pi|
        # (0.5 gap_atol) through A's sampler term
        scale = float(max_abs(expected)) + (float(max_abs(s)) if loss_class is CISPOLoss else 0)
        torch.testing.assert_close(got, expected.to(got), atol=scale * gap_atol, rtol=0)
    reverse = torch.cat([s - t for t, s in zip(teacher, sampling, strict=True)])
    assert out.distill_reverse_kl.item() == pytest.approx(reverse.mean().item(), rel=1e-5)
    assert out.distill_teacher_logprob_mean.item() == pytest.approx(
        torch.cat(teacher).mean().item(), rel=1e-5
    )
    assert 0 < out.distill_teacher_share.item() < 1


def test_the_gradient_is_reinforce_on_the_token_advantage(sampler, distilled, tiny):
    """The sampler's log-probs replaced by the trainer's own (ratio exactly 1): GRPOLoss's
    gradient equals that of ``-sum_t A_it log pi_t / n`` with ``A_it`` from the batch."""
    loss = GRPOLoss(sampler, distillation=DistillationSettings(coeff=0.5, task_weight=0.25))
    own = loss.anchor_log_probs(distilled)  # full, the prompt's positions 0 (not scored)
    batch = distilled.clone(False)
    batch.set("log_probs", own)
    out = loss(batch)
    out.loss.backward()
    grads = [p.grad.clone() for p in tiny.parameters()]
    tiny.zero_grad(set_to_none=True)
    scored = loss.actor(batch.select("tokens", "masks", strict=False))
    current, masks = scored["log_probs"].full, scored["masks"]
    mask = prediction_mask(masks) & response_columns(masks)  # masking_strategy "sft"
    sampling, _ = align_to_layout(own, None, masks, "own")
    teacher, _ = align_to_layout(batch["teacher_log_probs"], None, masks, "teacher")
    token_advantage = 0.25 * batch["advantage"][:, None] + 0.5 * (teacher - sampling)
    assert out.loss.item() == pytest.approx(-token_advantage[mask].mean().item(), rel=1e-6)
    (-(token_advantage.detach() * current)[mask].sum() / mask.sum()).backward()
    vocab = tiny.config.vocab_size
    for got, p in zip(grads, tiny.parameters(), strict=True):
        bound = summation_atol(max_abs(p.grad), vocab)
        torch.testing.assert_close(got, p.grad, atol=bound, rtol=0)


@pytest.mark.parametrize("loss_class", [GRPOLoss, GSPOLoss, CISPOLoss])
@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean"])
def test_a_teacher_that_agrees_gives_the_loss_without_distillation_bit_for_bit(
    sampler, rollout, tiny, loss_class, aggregation
):
    """teacher == sampler and task_weight 1: A_it = 1 * A_i + coeff * 0 = A_i exactly, so the
    per-token advantage takes the per-sequence one's path to the same bits."""
    options = {"aggregation": aggregation, "kl_to_inference_coeff": 0.1, "tis_cap": 2.0}
    plain = loss_class(sampler, **options)(rollout)
    plain.loss.backward()
    want = [p.grad.clone() for p in tiny.parameters()]
    tiny.zero_grad(set_to_none=True)
    batch = rollout.clone(False)
    batch.set("teacher_log_probs", rollout["log_probs"])
    settings = DistillationSettings(coeff=3.0, task_weight=1.0)
    distilled = loss_class(sampler, distillation=settings, **options)(batch)
    distilled.loss.backward()
    assert distilled.loss.item() == plain.loss.item()
    assert distilled.clip_fraction.item() == plain.clip_fraction.item()
    assert all(torch.equal(p.grad, w) for p, w in zip(tiny.parameters(), want, strict=True))
    assert distilled.distill_reverse_kl.item() == 0.0
    assert distilled.distill_teacher_share.item() == 0.0


def test_packed_and_padded_scoring_give_the_same_distilled_loss(
    distilled, tiny, tokenizer, monkeypatch
):
    from llmrl.policies import response_scoring

    # the rows share prompts, which would be scored once, unpacked: price that forward out
    monkeypatch.setattr(response_scoring, "shared_token_count", lambda *_: math.inf)
    packed_scoring = mock.Mock(wraps=response_scoring.score_packed)
    monkeypatch.setattr(response_scoring, "score_packed", packed_scoring)
    settings = DistillationSettings(coeff=0.5, task_weight=0.25)
    results = []
    for packing in (True, False):
        policy = TransformersWrapper(tiny, tokenizer, packing=packing)
        out = GRPOLoss(policy, aggregation="prompt_mean", distillation=settings)(distilled)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in tiny.parameters()]))
        tiny.zero_grad(set_to_none=True)
    assert packed_scoring.call_count == 1  # the packed loss's one forward; none for the padded
    (packed, packed_grads), (padded, padded_grads) = results
    # the advantages are the batch's (the same in both layouts); the log-probs differ by the
    # order of their sums (tests/policies/test_packing.py), the loss -mean(A r) by |A| that
    with torch.no_grad():
        max_logit = max(
            max_abs(tiny(input_ids=x[None]).logits) for x in distilled["tokens"].as_list("full")
        )
    vocab = tiny.config.vocab_size
    lp_atol = log_prob_atol(max_logit, vocab)
    assert packed.loss.item() == pytest.approx(padded.loss.item(), abs=4 * lp_atol)
    for name in ("distill_reverse_kl", "distill_teacher_logprob_mean", "distill_teacher_share"):
        assert packed.get(name).item() == padded.get(name).item(), name  # the batch's alone
    for got, want in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(got, want, atol=summation_atol(max_abs(want), vocab), rtol=0)


def test_a_batch_without_teacher_log_probs_is_refused_naming_the_key_and_its_writer(
    sampler, rollout
):
    loss = GRPOLoss(sampler, distillation=DistillationSettings())
    with pytest.raises(KeyError, match=r"'teacher_log_probs'.*topology\.teacher"):
        loss(rollout)


def test_a_teacher_scoring_other_tokens_is_refused_naming_the_row(sampler, distilled):
    rows = distilled["teacher_log_probs"].as_list("response")
    rows[1] = rows[1][:-1]
    batch = distilled.clone(False)
    batch.set("teacher_log_probs", LogProbs.from_sequences(response=rows))
    lengths = (len(rows[1]), len(distilled["log_probs"].as_list("response")[1]))
    message = rf"row 1: 'teacher_log_probs' has {lengths[0]} response log-probs, the sampler's "
    with pytest.raises(ValueError, match=message + rf"log_probs {lengths[1]}"):
        GRPOLoss(sampler, distillation=DistillationSettings())(batch)


def test_trained_prompt_positions_need_the_teachers_prompt_log_probs(sampler, distilled):
    """rlhf trains the earlier assistant turn of row 4 and 5's prompt (the third chat)."""
    batch = distilled.clone(False)
    response = distilled["teacher_log_probs"].as_list("response")
    batch.set("teacher_log_probs", LogProbs.from_sequences(response=response))
    loss = GRPOLoss(sampler, masking_strategy="rlhf", distillation=DistillationSettings())
    with pytest.raises(ValueError, match="row 4: 'teacher_log_probs' has no values"):
        loss(batch)
    assert torch.isfinite(loss(distilled).loss)  # with the prompt's log-probs


def test_without_distillation_the_teacher_log_probs_change_nothing(sampler, distilled, rollout):
    plain = GRPOLoss(sampler)(rollout)
    with_teacher = GRPOLoss(sampler)(distilled)
    assert plain.loss.item() == with_teacher.loss.item()
    assert with_teacher.distill_reverse_kl is None
