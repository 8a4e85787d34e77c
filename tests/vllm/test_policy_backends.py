"""One policy test suite over both backends: llmrl's transformers engine and vLLM's CPU build.

Both serve the real SmolLM2-135M in fp32, so sampled tokens, log-probs and scores can be
compared across backends. The last tests push new weights into the engine through vLLM's
weight-transfer API (``llmrl_file``) and check that it then scores exactly like the trainer's
model, with the prefix cache dropped.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Text, Tokens
from llmrl.policies import TransformersWrapper
from llmrl.policies.generation_kwargs import GenerationKwargsError
from llmrl.policies.vllm_engine import VLLMEngine
from llmrl.policies.vllm_wrapper import vLLMWrapper
from tests.support.chats import PROMPTS, history_batch
from tests.vllm.conftest import (
    assert_close_rows,
    assert_trainer_reproduces_sampled_log_probs,
    engine_log_probs,
    hf_log_probs,
    perturbed,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BACKENDS = ["transformers", "vllm"]


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = VLLMEngine(model_dir, dtype="float32", max_model_len=1024, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def make_policy(engine, hf_model, tokenizer):
    """``make_policy(backend, **settings)``: a policy of that backend over the shared model."""

    def make(backend: str, **settings):
        if backend == "vllm":
            return vLLMWrapper(engine, tokenizer, **settings)
        return TransformersWrapper(hf_model, tokenizer, **settings)

    return make


def _tokens_batch(prompts: list[list[int]]) -> TensorDict:
    tokens = Tokens.from_sequences(prompt=[torch.tensor(p) for p in prompts])
    return TensorDict(
        {"tokens": tokens, "row_id": torch.arange(len(prompts))}, batch_size=[len(prompts)]
    )


def _messages(chat) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in chat.to_chats()]


# ---------------------------------------------------------------------- input modes
@pytest.mark.parametrize("backend", BACKENDS)
def test_history_mode_samples_groups_whose_log_probs_the_trainer_reproduces(
    make_policy, backend, hf_model
):
    policy = make_policy(backend, num_samples=2, generate_kwargs={"max_new_tokens": 12, "seed": 0})
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 2])
    for b in range(3):
        assert (out[b]["row_id"] == b).all()
        for k in range(2):
            assert _messages(out[b]["history"].prompt[k]) == _messages_of(PROMPTS[b])
    flat = out.reshape(-1)
    assert_trainer_reproduces_sampled_log_probs(hf_model, flat)
    sampled = flat["log_probs"].as_list("response")
    # and so does the backend's own scoring of the same sequences
    scored = policy.get_new_version(generate=False, input_mode="tokens", num_samples=None)(flat)
    assert_close_rows(sampled, scored["log_probs"].as_list("response"))


def _messages_of(prompt: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in prompt]


@pytest.mark.parametrize("backend", BACKENDS)
def test_text_mode_tokenizes_prompts_as_the_tokenizer_does(make_policy, backend, tokenizer):
    td = TensorDict({"text": Text.from_strings(prompt=["Once upon a time", "2 + 2 ="])}, [2])
    out = make_policy(backend, input_mode="text", generate_kwargs={"max_new_tokens": 6})(td)
    assert [str(p) for p in out["text"].prompt] == ["Once upon a time", "2 + 2 ="]
    for row, prompt in enumerate(["Once upon a time", "2 + 2 ="]):
        expected = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert out["tokens"].as_list("prompt")[row].tolist() == expected
        response = out["tokens"].as_list("response")[row]
        assert str(out["text"].full[row]) == prompt + tokenizer.decode(
            response, skip_special_tokens=True
        )


def test_greedy_tokens_mode_gives_the_same_tokens_on_both_backends(make_policy):
    prompts = [[1, 9690, 198, 504, 3458, 28], [504, 3458, 28, 253, 9516]]
    greedy = {"max_new_tokens": 8, "do_sample": False}
    outs = [
        make_policy(backend, input_mode="tokens", generate_kwargs=greedy)(_tokens_batch(prompts))
        for backend in BACKENDS
    ]
    responses = [[r.tolist() for r in out["tokens"].as_list("response")] for out in outs]
    assert responses[0] == responses[1]
    assert [p.tolist() for p in outs[1]["tokens"].as_list("prompt")] == prompts
    by_backend = [out["log_probs"].as_list("response") for out in outs]
    assert_close_rows(*by_backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_samples_of_a_prompt_differ(make_policy, backend):
    policy = make_policy(backend, num_samples=4, generate_kwargs={"max_new_tokens": 16, "seed": 1})
    out = policy(history_batch(PROMPTS[:1]))
    assert out.batch_size == torch.Size([1, 4])
    assert len({tuple(r.tolist()) for r in out[0]["tokens"].as_list("response")}) == 4


# ---------------------------------------------------------------------- ends of responses
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stop_string_ends_the_response_and_completes_the_reply(make_policy, backend, tokenizer):
    policy = make_policy(
        backend, num_samples=3, generate_kwargs={"max_new_tokens": 48, "stop": ["."], "seed": 0}
    )
    prompt = [[{"role": "user", "content": "Write three sentences about the sea."}]]
    out = policy(history_batch(prompt)).reshape(-1)
    stopped = 0
    for row, response in enumerate(out["tokens"].as_list("response")):
        text, reply = tokenizer.decode(response), out["history"].full[row][-1]
        if "." in text:
            stopped += 1
            assert "." not in tokenizer.decode(response[:-1]), f"row {row}: ran past the '.'"
            assert reply.is_complete, f"row {row}"
        else:
            assert len(response) == 48 and not reply.is_complete, f"row {row}: {text!r}"
    assert stopped, "SmolLM2 writes a '.' within 48 tokens in most samples"


@pytest.mark.parametrize("backend", BACKENDS)
def test_end_of_sequence_completes_a_reply_and_the_budget_does_not(make_policy, backend, tokenizer):
    policy = make_policy(backend, num_samples=2, generate_kwargs={"max_new_tokens": 24, "seed": 0})
    prompt = [[{"role": "user", "content": "Answer with one word: what colour is the sky?"}]]
    out = policy(history_batch(prompt)).reshape(-1)
    ended = 0
    for row, response in enumerate(out["tokens"].as_list("response")):
        reply = out["history"].full[row][-1]
        if int(response[-1]) == tokenizer.eos_token_id:
            ended += 1
            assert reply.is_complete, f"row {row} ended on EOS"
        else:
            assert len(response) == 24 and not reply.is_complete, f"row {row}"
    assert ended, "a one-word answer ends with EOS within 24 tokens"


# ---------------------------------------------------------------------- scoring
@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_a_conversation_gives_the_models_log_probs(
    make_policy, backend, hf_model, tokenizer
):
    answered = [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
        [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hello there!"}],
    ]
    td = history_batch(answered)
    td["history"].full = td["history"].prompt
    td["history"].prompt = None
    out = make_policy(backend, generate=False, pad_output=False)(td)
    full = out["tokens"].as_list("full")
    expected = [hf_log_probs(hf_model, seq.tolist()) for seq in full]
    assert_close_rows(expected, out["log_probs"].as_list("full"))
    assistant = out["masks"].as_list("assistant")
    answer = tokenizer("4.", add_special_tokens=False)["input_ids"]
    assert full[0][assistant[0]].tolist()[: len(answer)] == answer


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_what_is_wrong(make_policy, backend):
    with pytest.raises(ValueError, match="input_mode must be one of"):
        make_policy(backend, input_mode="pixels")
    with pytest.raises(GenerationKwargsError, match="max_new_tokens"):
        make_policy(backend, generate_kwargs={"max_new_tokens": 0})
    with pytest.raises(KeyError, match="text"):
        make_policy(backend, input_mode="text")(history_batch())


def test_vllm_refuses_logits_and_gradients(make_policy):
    scorer = make_policy("vllm", generate=False, input_mode="tokens", return_logits=True)
    td = TensorDict({"tokens": Tokens.from_sequences(full=[torch.tensor([1, 2, 3])])}, [1])
    with pytest.raises(ValueError, match=r"vLLM does not return logits.*TransformersWrapper"):
        scorer(td)


# ---------------------------------------------------------------------- weight updates
PROBE = list(range(100, 160))


def test_after_load_weights_the_engine_scores_like_the_trainer(engine, hf_model, tmp_path):
    engine.weight_folder = str(tmp_path)
    trainer = perturbed(hf_model, 0.02, seed=0)
    before = engine_log_probs(engine, PROBE)
    gap = (before - hf_log_probs(trainer, PROBE)).abs().max().item()
    assert gap > 100 * 2e-4, "fixture: the step must move the log-probs measurably"
    try:
        written = engine.load_weights(trainer.state_dict().items(), version=1)
        assert engine.weight_version() == "1"
        # tied embedding and head are sent once: 134.5M parameters, not 163M, at 4 bytes
        assert written == sum(p.numel() for p in trainer.parameters()) * 4
        assert list(tmp_path.iterdir()) == [], "the weight file is removed after the load"
        assert_close_rows([hf_log_probs(trainer, PROBE)], [engine_log_probs(engine, PROBE)])
        # a partial update (one layer's MLP) changes exactly that much
        second = perturbed(trainer, 0.0, seed=0)
        with torch.no_grad():
            second.model.layers[3].mlp.down_proj.weight.mul_(1.5)
        down = "model.layers.3.mlp.down_proj.weight"
        engine.load_weights([(down, second.state_dict()[down])], version=2)
        assert_close_rows([hf_log_probs(second, PROBE)], [engine_log_probs(engine, PROBE)])
    finally:
        engine.load_weights(hf_model.state_dict().items(), version=3)
    assert_close_rows([hf_log_probs(hf_model, PROBE)], [engine_log_probs(engine, PROBE)])
    assert_close_rows([before], [engine_log_probs(engine, PROBE)])


def test_an_update_drops_the_prefix_cache(engine, hf_model, tokenizer):
    # sampling reuses cached prefixes (prompt log-prob requests bypass the cache): a long shared
    # prompt is cached by a first request, then the weights change under it
    shared = tokenizer("The history of the harbour town. " * 40, add_special_tokens=False)
    prompt = shared["input_ids"][:300]
    greedy = {"max_tokens": 4, "n": 1, "temperature": 0.0}
    engine.generate([prompt], greedy)
    trainer = perturbed(hf_model, 0.02, seed=5)
    try:
        engine.load_weights(trainer.state_dict().items(), version=10)
        [[(tokens, log_probs, _)]] = engine.generate([prompt], greedy)
        expected = hf_log_probs(trainer, prompt + tokens)[-len(tokens) :]
        assert_close_rows([expected], [log_probs])
    finally:
        engine.load_weights(hf_model.state_dict().items(), version=11)


def test_a_file_whose_checksum_does_not_match_is_refused_and_changes_nothing(
    engine, hf_model, tmp_path
):
    from llmrl.policies.vllm_file_transfer import write_weights

    before = engine_log_probs(engine, PROBE)
    trainer = perturbed(hf_model, 0.02, seed=7)
    path = write_weights(trainer.state_dict().items(), tmp_path)
    engine.llm.start_weight_update()
    with pytest.raises(Exception, match="SHA-256 does not match"):
        engine.llm.update_weights({"update_info": {"path": str(path), "sha256": "0" * 64}})
    assert torch.equal(engine_log_probs(engine, PROBE), before), "the model is untouched"
    missing = tmp_path / "gone.safetensors"
    engine.llm.start_weight_update()
    with pytest.raises(Exception, match="not on this engine's node"):
        engine.llm.update_weights({"update_info": {"path": str(missing)}})
    assert torch.equal(engine_log_probs(engine, PROBE), before)


def test_tensors_whose_checksum_does_not_match_are_refused_and_change_nothing(engine, hf_model):
    from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum

    before = engine_log_probs(engine, PROBE)
    trainer = perturbed(hf_model, 0.02, seed=8)
    sent = weights_checksum(trainer.state_dict())
    with pytest.raises(WeightChecksumError, match="does not match the sender's"):
        engine.load_weights(hf_model.state_dict().items(), version=20, checksum=sent)
    assert torch.equal(engine_log_probs(engine, PROBE), before), "the model is untouched"
    try:
        engine.load_weights(trainer.state_dict().items(), version=21, checksum=sent)
        assert engine.weight_version() == "21"
        assert_close_rows([hf_log_probs(trainer, PROBE)], [engine_log_probs(engine, PROBE)])
    finally:
        engine.load_weights(hf_model.state_dict().items(), version=22)


def test_all_zero_weights_give_the_uniform_distribution(engine, hf_model, vocab_size):
    # a hand-computed check of a load: zero weights (norms included) give zero logits
    try:
        engine.load_weights((n, torch.zeros_like(t)) for n, t in hf_model.state_dict().items())
        lps = engine_log_probs(engine, PROBE)[1:]
        # zero logits: lse = log of V ones (exact in fp32), one rounding of log V ~ 10.8 (1e-6)
        assert torch.allclose(lps, torch.full_like(lps, -math.log(vocab_size)), atol=1e-5)
    finally:
        engine.load_weights(hf_model.state_dict().items())
    assert_close_rows([hf_log_probs(hf_model, PROBE)], [engine_log_probs(engine, PROBE)])
