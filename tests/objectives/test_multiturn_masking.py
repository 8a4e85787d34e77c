"""Multi-turn rows under GRPOLoss's masking strategies: a hand-built tool episode (system, user,
assistant code, tool output, assistant answer) with SmolLM2's tokenizer and the tiny model.

Token positions of the conversation (ChatML)::

     0-7   <|im_start|>system\\nUse tools.<|im_end|>\\n
     8-20  <|im_start|>user\\nWhat is 6 * 7?<|im_end|>\\n
    21-24  <|im_start|>assistant\\n                       header: not trained
    25-37  ```python\\nprint(6 * 7)\\n```<|im_end|>       turn 1: trained under rlhf
    38-45  \\n<|im_start|>tool\\n42<|im_end|>\\n            tool message: never trained
    46-49  <|im_start|>assistant\\n                       the prompt of turn 2 ends here
    50-    turn 2: the sampled response (or "#### 42<|im_end|>", 50-54)
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History, LogProbs
from llmrl.objectives import GRPOLoss
from llmrl.policies import TransformersWrapper
from tests.tolerances import log_prob_atol, max_abs

PROMPT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "```python\nprint(6 * 7)\n```"},
    {"role": "tool", "content": "42"},
]
TURN_1 = list(range(25, 38))
PROMPT_TOKENS = 50
ADVANTAGE = torch.tensor([1.0, -1.0])


def test_chat_tokens_mark_both_assistant_turns_and_nothing_else(tokenizer):
    chat = [*PROMPT, {"role": "assistant", "content": "#### 42"}]
    tokens = History.from_chats([chat]).apply_chat_template(tokenizer)
    ids, mask = tokens.as_list("input_ids")[0], tokens.as_list("assistant_mask")[0]
    assert len(ids) == 56
    assert mask.nonzero().flatten().tolist() == [*TURN_1, 50, 51, 52, 53, 54]
    assert tokenizer.decode(ids[25:38]) == "```python\nprint(6 * 7)\n```<|im_end|>"
    assert tokenizer.decode(ids[50:55]) == "#### 42<|im_end|>"
    assert tokenizer.decode(ids[38:46]) == "\n<|im_start|>tool\n42<|im_end|>\n"


@pytest.fixture(scope="module")
def sampler(tiny, tokenizer):
    return TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 5, "seed": 0})


@pytest.fixture(scope="module")
def second_turn(sampler):
    """The sampler's turn 2 after the tool message, twice, with advantages +1 and -1."""
    history = History.from_chats([PROMPT, PROMPT])
    state = TensorDict({"history": ChatHistory(prompt=history, batch_size=[2])}, [2])
    out = sampler(state)
    out["advantage"] = ADVANTAGE
    return out


def _trained(loss: GRPOLoss, batch: TensorDict) -> tuple[list[list[int]], torch.Tensor]:
    """The positions with a non-zero per-token loss in each row, and the losses."""
    per_token = loss(batch).loss_objective.detach()
    return [row.nonzero().flatten().tolist() for row in per_token], per_token


def _response_positions(batch: TensorDict) -> list[int]:
    lengths = {len(r) for r in batch["tokens"].as_list("response")}
    assert len(lengths) == 1, "both rows sampled 5 tokens (the random model never stops)"
    assert [len(p) for p in batch["tokens"].as_list("prompt")] == [PROMPT_TOKENS] * 2
    return list(range(PROMPT_TOKENS, PROMPT_TOKENS + lengths.pop()))


def test_rlhf_trains_every_assistant_turn_with_the_advantage(sampler, second_turn):
    response = _response_positions(second_turn)
    positions, per_token = _trained(
        GRPOLoss(sampler, aggregation="none", masking_strategy="rlhf"), second_turn
    )
    assert positions == [TURN_1 + response] * 2
    # the first update: ratio 1 everywhere, each trained token's loss is -A of its row: the
    # ratio is exp(d) on the response, d the sampling (decode) vs training (one pass) gap of
    # the same fp32 log-prob, up to log_prob_atol (measured 1 ulp, 9.5e-7, on EPYC AVX-512),
    # times |A| = 1; exactly 1 on the earlier turn (anchored on the current log-probs)
    sequences = second_turn["tokens"].as_list("full")
    with torch.no_grad():
        max_logit = max(max_abs(sampler.model(input_ids=s[None]).logits) for s in sequences)
    atol = log_prob_atol(max_logit, sampler.model.config.vocab_size)
    for row, advantage in enumerate(ADVANTAGE.tolist()):
        assert per_token[row, TURN_1 + response].tolist() == pytest.approx(
            [-advantage] * (len(TURN_1) + len(response)), abs=atol
        )
    positions, _ = _trained(GRPOLoss(sampler, aggregation="none"), second_turn)
    assert positions == [response] * 2, "sft: the last response only"


def test_rlhf_gradients_reach_the_earlier_turn(sampler, second_turn, tiny):
    # the per-token losses of turn 1 alone (a prompt position) give the model a gradient
    loss = GRPOLoss(sampler, aggregation="none", masking_strategy="rlhf")
    per_token = loss(second_turn.clone(False)).loss_objective
    tiny.zero_grad(set_to_none=True)
    per_token[:, TURN_1].sum().backward()
    grads = [p.grad for p in tiny.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    tiny.zero_grad(set_to_none=True)


def test_an_explicit_anchor_gives_earlier_turns_their_ratio(sampler, second_turn):
    # the anchor is the current log-probs, lowered by log 1.5 on turn 1: ratio 1.5 there, so
    # with eps 0.2 the loss is -min(1.5 A, 1.2 A): -1.2 for A = +1 (clipped), 1.5 for A = -1
    scorer = sampler.get_new_version(generate=False, input_mode="tokens")
    with torch.no_grad():
        current = scorer(second_turn)["log_probs"].as_list("full")
    shift = torch.zeros(len(current[0]))
    shift[TURN_1] = math.log(1.5)
    batch = second_turn.clone(False)
    batch["anchor"] = LogProbs.from_sequences(full=[row - shift for row in current])
    loss = GRPOLoss(
        sampler, aggregation="none", masking_strategy="rlhf", old_log_probs_key="anchor"
    )
    positions, per_token = _trained(loss, batch)
    response = _response_positions(batch)
    assert positions == [TURN_1 + response] * 2
    # current - log 1.5 rounds by <= ulp(|log p| < 16) = 1e-6: the ratio 1.5 to 2e-6, |A| = 1
    assert per_token[0, TURN_1].tolist() == pytest.approx([-1.2] * len(TURN_1), abs=1e-5)
    assert per_token[1, TURN_1].tolist() == pytest.approx([1.5] * len(TURN_1), abs=1e-5)
    assert per_token[:, response].flatten().tolist() == pytest.approx(
        [-1.0] * len(response) + [1.0] * len(response), abs=1e-5
    )
