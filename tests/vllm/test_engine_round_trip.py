"""The fast tier's vLLM module: one engine of vLLM's CPU build on a tiny random model, and the
three things every vLLM path of llmrl relies on: sampling with log-probs the trainer
reproduces, scoring, and a weight update after which the engine scores like the trainer.

One engine start (about 30 s on 2 cores; the model's size barely matters). The same checks on
the real SmolLM2, and everything else about the backend, are in the slow modules beside it
(test_policy_backends.py, test_remote_engine.py, test_grpo_runtime_vllm.py).
"""

from __future__ import annotations

import pytest
import torch

from llmrl.policies.vllm_wrapper import vLLMWrapper
from tests.support.chats import history_batch
from tests.vllm.conftest import (
    ATOL,
    assert_close_rows,
    assert_trainer_reproduces_sampled_log_probs,
    engine_log_probs,
    hf_log_probs,
    perturbed,
)

pytestmark = pytest.mark.vllm

PROBE = [1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216, 33, 34]


def test_sampled_log_probs_are_the_trainers(tiny_engine, tiny_hf, tokenizer):
    policy = vLLMWrapper(
        tiny_engine, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 8, "seed": 0}
    )
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 2])
    flat = out.reshape(-1)
    responses = flat["tokens"].as_list("response")
    assert all(len(r) == 8 or r[-1] == tokenizer.eos_token_id for r in responses)
    assert_trainer_reproduces_sampled_log_probs(tiny_hf, flat)
    # the engine's own scoring of the sampled sequences gives the same numbers
    scored = policy.get_new_version(generate=False, input_mode="tokens", num_samples=None)(flat)
    sampled = flat["log_probs"].as_list("response")
    assert_close_rows(sampled, scored["log_probs"].as_list("response"))


def test_scoring_gives_the_models_log_probs(tiny_engine, tiny_hf):
    assert_close_rows([hf_log_probs(tiny_hf, PROBE)], [engine_log_probs(tiny_engine, PROBE)])


def test_after_a_weight_update_the_engine_scores_like_the_trainer(tiny_engine, tiny_hf, tmp_path):
    tiny_engine.weight_folder = str(tmp_path)
    trainer = perturbed(tiny_hf, 0.05, seed=0)
    before = engine_log_probs(tiny_engine, PROBE)
    gap = (before - hf_log_probs(trainer, PROBE)).abs().max().item()
    assert gap > 100 * ATOL, "fixture: the step must move the log-probs measurably"
    try:
        tiny_engine.load_weights(trainer.state_dict().items(), version=1)
        assert tiny_engine.weight_version() == "1"
        assert list(tmp_path.iterdir()) == [], "the weight file is removed after the load"
        assert_close_rows([hf_log_probs(trainer, PROBE)], [engine_log_probs(tiny_engine, PROBE)])
    finally:
        tiny_engine.load_weights(tiny_hf.state_dict().items(), version=2)
    assert_close_rows([before], [engine_log_probs(tiny_engine, PROBE)])
