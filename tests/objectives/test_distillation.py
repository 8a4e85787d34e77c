"""On-policy distillation in the GRPO losses: the per-token advantage against hand-computed
values, and GRPOLoss with ``distillation`` on a tiny model's rollout scored by another tiny
model (the teacher), against the value the math gives at ratio 1."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.model_signals import DistillationSettings
from llmrl.envs.transforms import RetrieveLogProb
from llmrl.objectives import CISPOLoss, GRPOLoss
from llmrl.objectives.distillation import distillation_advantage, reverse_kl
from llmrl.objectives.token_level import field_rows
from llmrl.policies import TransformersWrapper
from tests.tolerances import log_prob_atol, max_abs


def test_the_advantage_of_each_token_by_hand():
    # row 0: 3 tokens, A = 1.0; row 1: 2 tokens (then padding), A = -2.0
    advantage = torch.tensor([1.0, -2.0])
    teacher = torch.tensor([[-1.0, -0.5, -3.0], [-2.0, -0.25, 9.0]])
    sampler = torch.tensor([[-2.0, -0.5, -1.0], [-1.0, -1.25, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # gaps teacher - sampler: [1.0, 0.0, -2.0] and [-1.0, 1.0, (pad)]
    # coeff 0.5, task_weight 0.25: 0.25 * A + 0.5 * gap
    #   row 0: 0.25 + [0.5, 0.0, -1.0] = [0.75, 0.25, -0.75]
    #   row 1: -0.5 + [-0.5, 0.5]      = [-1.0, 0.0], padding 0
    got = distillation_advantage(advantage, teacher, sampler, mask, 0.5, 0.25)
    assert got.tolist() == [[0.75, 0.25, -0.75], [-1.0, 0.0, 0.0]]
    # pure distillation: the gaps alone, scaled by coeff
    assert distillation_advantage(advantage, teacher, sampler, mask, 2.0, 0.0).tolist() == [
        [2.0, 0.0, -4.0],
        [-2.0, 2.0, 0.0],
    ]
    # reverse KL: mean of sampler - teacher over the 5 tokens: (-1 + 0 + 2 + 1 - 1) / 5
    assert reverse_kl(teacher, sampler, mask).item() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="coeff > 0"):
        distillation_advantage(advantage, teacher, sampler, mask, 0.0, 1.0)


@pytest.fixture(scope="module")
def teacher_policy(tokenizer):
    from llmrl.models import tiny_model

    return TransformersWrapper(tiny_model(tokenizer, seed=1), tokenizer)


@pytest.fixture
def distilled(rollout, teacher_policy):
    """The rollout with the teacher's log-probs of its tokens."""
    return RetrieveLogProb(teacher_policy, out_key="teacher_log_probs").on_step(rollout.clone())


@pytest.mark.parametrize("loss_class", [GRPOLoss, CISPOLoss])
def test_each_response_token_is_trained_on_its_teacher_gap_at_ratio_one(
    sampler, distilled, tiny, loss_class
):
    settings = DistillationSettings(coeff=0.5, task_weight=0.25)
    clip = 0.2 if loss_class is GRPOLoss else (1.0, 0.28)
    loss = loss_class(sampler, aggregation="none", clip_epsilon=clip, distillation=settings)
    out = loss(distilled)
    scored = sampler.get_new_version(generate=False, input_mode="tokens", pad_output=True)
    masks = scored(distilled)["masks"]
    prompt_width = masks.prompt.shape[1]
    response = out.loss_objective.detach()[:, prompt_width:]
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
        # for GRPO's clipped term; CISPO's is that times log pi_t (its REINFORCE surrogate)
        expected = -(0.25 * advantage[row] + 0.5 * (t - s))
        got = response[row][masks.response[row]]
        if loss_class is CISPOLoss:
            expected = expected * s
        # the loss's log-probs and the sampler's differ by gap_atol: -A r moves by |A| gap_atol,
        # CISPO's -A log pi by |A| gap_atol + |log pi| (0.5 gap_atol) through A's sampler term
        scale = float(max_abs(expected)) + (float(max_abs(s)) if loss_class is CISPOLoss else 0)
        torch.testing.assert_close(got, expected.to(got), atol=scale * gap_atol, rtol=0)
    reverse = torch.cat([s - t for t, s in zip(teacher, sampling, strict=True)]).mean()
    assert out.distill_reverse_kl.item() == pytest.approx(reverse.item(), rel=1e-5)


def test_a_batch_without_teacher_log_probs_is_refused_naming_the_key(sampler, rollout):
    loss = GRPOLoss(sampler, distillation=DistillationSettings())
    with pytest.raises(KeyError, match="teacher_log_probs"):
        loss(rollout)


def test_without_distillation_the_teacher_log_probs_change_nothing(sampler, distilled, rollout):
    torch.manual_seed(0)
    plain = GRPOLoss(sampler)(rollout).loss
    with_teacher = GRPOLoss(sampler)(distilled).loss
    assert plain.item() == with_teacher.item()
