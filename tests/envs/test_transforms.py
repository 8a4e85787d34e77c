"""PolicyVersion, AddThinkingPrompt, TaskReward, RetrieveLogProb and KLRewardTransform."""

from __future__ import annotations

import pytest
import torch

from llmrl.envs import (
    AddThinkingPrompt,
    ChatEnv,
    KLRewardTransform,
    PolicyVersion,
    RetrieveLogProb,
    TaskReward,
    queries,
)
from llmrl.envs.tasks import ArithmeticTask
from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from tests.support.scripted import ScriptedPolicy
from tests.tolerances import max_abs, summation_atol


def test_policy_version_stamps_reset_and_step():
    version = PolicyVersion()
    env = ChatEnv(transforms=[version])
    state = env.reset(queries(["a", "b"]))
    assert state["policy_version"].tolist() == [0, 0]
    assert version.increment() == 1
    transition = env.step(ScriptedPolicy(["x", "y"])(state))
    assert transition["policy_version"].tolist() == [1, 1]
    assert transition["next", "policy_version"].tolist() == [1, 1], "what the next turn sees"


def test_thinking_prompt_extends_or_creates_the_system_message():
    env = ChatEnv(system_prompt="Base.", transforms=[AddThinkingPrompt("THINK")])
    chats = env.reset(queries(["q"]))["history"].prompt.to_chats()
    assert chats[0][0]["content"] == "Base.\n\nTHINK"
    bare = ChatEnv(transforms=[AddThinkingPrompt("THINK")]).reset(queries(["q"]))
    assert [m["role"] for m in bare["history"].prompt.to_chats()[0]] == ["system", "user"]


def test_task_reward_scores_each_reply_against_its_answer():
    task = ArithmeticTask(format_reward=0.1)
    env = ChatEnv(transforms=[TaskReward(task)])
    state = env.reset(queries(["2+2?", "2+2?", "2+2?"], answer=["4", "4", "4"]))
    replies = ["2 + 2 = 4\n#### 4", "#### 5", "four"]
    transition = env.step(ScriptedPolicy(replies)(state))
    # constants stored as fp32 (0.1 to 1.5e-8 relative), within approx's default rel=1e-6
    assert transition["reward"].tolist() == pytest.approx([1.0, 0.1, 0.0])
    assert transition["correct"].tolist() == [True, False, False]
    assert transition["formatted"].tolist() == [True, True, False]


@pytest.fixture(scope="module")
def policies(tiny, tokenizer):
    sampler = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 6, "seed": 0})
    reference = TransformersWrapper(tiny_model(tokenizer, seed=5), tokenizer)
    return sampler, reference


def _scored_by_hand(policy, transition):
    """Reference log-probs of each response, computed with a plain forward pass."""
    out = []
    for full, prompt in zip(
        transition["tokens"].as_list("full"), transition["tokens"].as_list("prompt"), strict=True
    ):
        with torch.no_grad():
            logits = policy.model(full[None]).logits[0].float()
        log_probs = logits[:-1].log_softmax(-1).gather(-1, full[1:, None]).squeeze(-1)
        out.append(log_probs[len(prompt) - 1 :])
    return out


def _log_prob_atol(policy, transition) -> float:
    """How far a log-prob of the batched scoring may be from one by hand: the same fp32 sums
    in another order, the longest the vocabulary's in ``lse`` (terms up to 1, plus ``z_y``:
    magnitude ``1 + max|z|``)."""
    with torch.no_grad():
        logits = [policy.model(full[None]).logits for full in transition["tokens"].as_list("full")]
    vocab = logits[0].shape[-1]
    return summation_atol(1 + max(max_abs(z) for z in logits), vocab)


def test_retrieve_log_prob_stores_reference_log_probs(policies):
    sampler, reference = policies
    env = ChatEnv(transforms=[RetrieveLogProb(reference)])
    transition = env.step(sampler(env.reset(queries(["Hello", "What is up?"]))))
    stored = transition["ref_log_probs"].as_list("response")
    atol = _log_prob_atol(reference, transition)  # ~3e-4; measured 1e-6 (1 ulp)
    for got, expected in zip(stored, _scored_by_hand(reference, transition), strict=True):
        torch.testing.assert_close(got, expected, atol=atol, rtol=0)
    full = transition["ref_log_probs"].as_list("full")
    prompt_len = [len(p) for p in transition["tokens"].as_list("prompt")]
    assert all((f[:n] == 0).all() for f, n in zip(full, prompt_len, strict=True)), (
        "assistant_only: prompt positions hold 0"
    )


def test_kl_reward_subtracts_coeff_times_summed_log_ratio(policies):
    sampler, reference = policies
    env = ChatEnv(transforms=[KLRewardTransform(reference, coeff=0.5)])
    transition = env.step(sampler(env.reset(queries(["Hello", "What is up?"]))))
    by_hand = [
        (lp - ref).sum()
        for lp, ref in zip(
            transition["log_probs"].as_list("response"),
            _scored_by_hand(reference, transition),
            strict=True,
        )
    ]
    # sums of <= 6 (max_new_tokens) log-prob differences, each off by up to _log_prob_atol,
    # independently: sqrt(6) of it (~8e-4; measured 2e-6)
    atol = 6**0.5 * _log_prob_atol(reference, transition)
    torch.testing.assert_close(transition["kl_to_ref"], torch.stack(by_hand), atol=atol, rtol=0)
    want_reward = -0.5 * torch.stack(by_hand)
    torch.testing.assert_close(transition["reward"], want_reward, atol=atol / 2, rtol=0)
    with pytest.raises(ValueError, match="coeff must be >= 0"):
        KLRewardTransform(reference, coeff=-1)
