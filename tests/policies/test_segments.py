"""Segmented sampling (llmrl.policies.segments): replies decoded a segment at a time and resumed
from their prefix, under the same weights or across a weight change."""

from __future__ import annotations

import copy

import pytest
import torch

from llmrl.policies import TransformersWrapper
from llmrl.policies.io_spec import GeneratedSample
from llmrl.policies.segments import (
    EMPTY,
    PARTIAL_KEY,
    RETURN_AFTER_GROUPS,
    GroupsEnded,
    Prefix,
    align_prefixes,
    attach_prefixes,
    join_segments,
)
from tests.support.chats import history_batch
from tests.support.segments import resume_until_done
from tests.tolerances import log_prob_atol, max_abs

BUDGET = 12


def _policy(model, tokenizer, **kwargs):
    settings = {"max_new_tokens": BUDGET, "seed": 0, **kwargs.pop("generate_kwargs", {})}
    return TransformersWrapper(model, tokenizer, generate_kwargs=settings, **kwargs)


def _atol(model, sequences) -> float:
    with torch.no_grad():
        max_logit = max(max_abs(model(input_ids=s[None]).logits) for s in sequences)
    return log_prob_atol(max_logit, model.config.vocab_size)


def test_greedy_segments_make_the_whole_greedy_reply(tiny, tokenizer):
    """Greedy decoding resumed every 5 tokens picks the tokens of one whole call: the prefix is
    continued, not restarted, and the budget counts the whole reply."""
    greedy = {"do_sample": False}
    whole = _policy(tiny, tokenizer, generate_kwargs=greedy)(history_batch())
    segmented = _policy(tiny, tokenizer, generate_kwargs=greedy, segment_tokens=5)
    outputs, boundaries = resume_until_done(segmented, history_batch())
    for row, out in enumerate(outputs):
        expected = whole["tokens"].as_list("response")[row]
        assert torch.equal(out["tokens"].response, expected)
        assert len(expected) == BUDGET  # the tiny random model never ends early
        assert boundaries[row] == [0, 5, 10]  # 5 + 5 + the 2 left of the budget
        assert out["text"].full == out["text"].prompt + out["text"].response
        atol = _atol(tiny, [out["tokens"].full])
        torch.testing.assert_close(
            out["log_probs"].response,
            whole["log_probs"].as_list("response")[row],
            atol=atol,
            rtol=0,
        )


def test_a_reply_across_a_weight_change_has_each_versions_log_probs(tiny, tokenizer):
    """Tokens sampled before the weights change carry the old weights' log-probs, those after
    the new weights': each part equals that version's scoring of the whole sequence."""
    model = copy.deepcopy(tiny)
    old = {k: v.clone() for k, v in model.state_dict().items()}
    policy = _policy(model, tokenizer, segment_tokens=4)

    def change_weights(call):
        if call == 1:  # between the first and the second segment
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.05 * torch.randn_like(parameter))

    outputs, boundaries = resume_until_done(policy, history_batch(), between=change_weights)
    new_model, old_model = model, copy.deepcopy(tiny)
    old_model.load_state_dict(old)
    for out, cuts in zip(outputs, boundaries, strict=True):
        assert cuts[:2] == [0, 4]
        full = out["tokens"].full
        sampled = out["log_probs"].response
        prompt = len(out["tokens"].prompt)
        scores = {}
        for name, scorer in (("old", old_model), ("new", new_model)):
            with torch.no_grad():
                logits = scorer(input_ids=full[None]).logits[0].float()
            picked = logits.log_softmax(-1)[prompt - 1 : -1].gather(-1, full[prompt:, None])
            scores[name] = picked.squeeze(-1)
        atol = max(_atol(old_model, [full]), _atol(new_model, [full]))
        torch.testing.assert_close(sampled[:4], scores["old"][:4], atol=atol, rtol=0)
        torch.testing.assert_close(sampled[4:], scores["new"][4:], atol=atol, rtol=0)
        # the change is visible: the new tokens are not the old weights' log-probs
        assert (sampled[4:] - scores["old"][4:]).abs().max() > 100 * atol


def test_join_cuts_at_the_budget_and_says_which_rows_go_on():
    prefixes = [Prefix(torch.tensor([5, 6]), torch.tensor([-1.0, -2.0])), EMPTY, EMPTY]
    samples = [
        GeneratedSample(torch.tensor([7, 8, 9]), torch.tensor([-3.0, -4.0, -5.0]), finished=False),
        GeneratedSample(torch.tensor([1, 2]), torch.tensor([-0.5, -0.25]), finished=True),
        GeneratedSample(torch.tensor([3, 4]), torch.tensor([-0.5, -0.25]), finished=False),
    ]
    joined, partial = join_segments(prefixes, samples, budget=4)
    assert joined[0].tokens.tolist() == [5, 6, 7, 8]  # cut at the budget of 4
    assert joined[0].log_probs.tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert not joined[0].finished  # at the budget without its end: truncated
    assert joined[1].finished
    assert partial == [False, False, True]  # at the budget, ended, goes on


def test_prefixes_of_several_callers_are_aligned_for_one_call():
    from tensordict import TensorDict

    one = attach_prefixes(
        TensorDict({"x": torch.zeros(2)}, [2]),
        [EMPTY, Prefix(torch.tensor([4]), torch.tensor([-1.0]))],
    )
    two = TensorDict({"x": torch.ones(1)}, [1])
    aligned = align_prefixes([one, two])
    merged = torch.cat(aligned)
    assert merged["resume_length"].tolist() == [0, 1, 0]
    assert merged["resume_tokens"].shape == (3, 1)


def test_more_than_one_sample_per_row_is_refused(tiny, tokenizer):
    policy = _policy(tiny, tokenizer, segment_tokens=4, num_samples=2)
    with pytest.raises(ValueError, match="num_samples=1"):
        policy(history_batch())


def test_groups_ended_waits_for_every_callers_wanted_groups():
    callers = torch.tensor([0, 0, 0, 0, 1, 1])
    groups = torch.tensor([1, 1, 2, 2, 3, 3])
    rule = GroupsEnded(callers, groups, {0: 1, 1: 1})
    assert not rule(torch.tensor([True, False, True, False, True, True]))  # caller 0: none whole
    assert rule(torch.tensor([True, False, True, True, True, True]))  # group 2 and group 3
    assert not rule(torch.tensor([True, True, True, True, True, False]))  # caller 1: none
    assert GroupsEnded(callers, groups, {0: 2, 1: 0})(torch.tensor([True] * 4 + [False] * 2))


def test_a_call_returns_once_the_wanted_groups_ended(eos_model, tokenizer):
    """Rows 0-1 form group 0, row 2 group 1; one group wanted: the call returns at the step
    the first group's last row ended, the other rows cut there and marked partial."""
    state = attach_prefixes(history_batch(), [EMPTY] * 3)
    state.set("group_id", torch.tensor([0, 0, 1]))
    state.set(RETURN_AFTER_GROUPS, torch.tensor([[5, 1]] * 3))
    budget = 200
    out = _policy(eos_model, tokenizer, generate_kwargs={"max_new_tokens": budget})(state)
    lengths = [len(r) for r in out["tokens"].as_list("response")]
    partial = out[PARTIAL_KEY].tolist()
    ended_groups = [g for g, rows in ((0, [0, 1]), (1, [2])) if not any(partial[r] for r in rows)]
    assert len(ended_groups) == 1
    cut = max(lengths)
    assert cut < budget  # returned early
    assert all(lengths[r] == cut for r in range(3) if partial[r])  # cut at the same step
    for row in range(3):
        ended = not partial[row]
        assert out["history"].full[row][-1].is_complete == ended
        assert (out["tokens"].as_list("response")[row][-1] == tokenizer.eos_token_id) == ended


def test_a_seeded_call_resuming_replies_moves_its_seed():
    """A seeded call samples from a generator of its own: a resumed segment draws with a seed
    moved by the tokens it resumes, not the first segment's uniforms again."""
    from llmrl.policies.generation_kwargs import GenerationKwargs
    from llmrl.policies.segments import segment_config

    config = GenerationKwargs.from_kwargs({"max_new_tokens": 10, "seed": 7})
    first = segment_config(config, [EMPTY, EMPTY], segment_tokens=4)
    assert (first.seed, first.max_new_tokens) == (7, 4)
    resumed = [Prefix(torch.tensor([1, 2, 3, 4]), torch.zeros(4)), EMPTY]
    second = segment_config(config, resumed, segment_tokens=4)
    assert second.seed == 7 * 1_000_003 + 4 and second.max_new_tokens == 4
    unseeded = segment_config(config.replace(seed=None), resumed, segment_tokens=8)
    assert unseeded.seed is None and unseeded.max_new_tokens == 8  # 10 - 0 (the empty prefix)
