"""vLLMWrapper: imports without vLLM, engine split/merge (fake engines), and real vLLM on a GPU.

The split/merge logic is backend-independent, so it runs everywhere against fake engines that
speak VLLMEngine's plain-data API. The tests marked ``GPU`` need vLLM and a CUDA device and run
the real SmolLM2-135M; the Ray ones also need Ray.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Tokens
from llmrl.models import MissingExtraError
from llmrl.policies.vllm_wrapper import split_evenly, vLLMWrapper
from tests.policies.conftest import PROMPTS, history_batch

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_RAY = importlib.util.find_spec("ray") is not None
GPU = pytest.mark.skipif(
    not (HAS_VLLM and torch.cuda.is_available()), reason="needs vLLM and a CUDA GPU"
)
NO_VLLM = pytest.mark.skipif(HAS_VLLM, reason="checks the error raised when vLLM is missing")
NEEDS_RAY = pytest.mark.skipif(not HAS_RAY, reason="needs Ray")


class FakeEngine:
    """Stands in for VLLMEngine: same plain-data methods, answers built from the prompt.

    Sample ``k`` of a prompt is ``[len(prompt), k, engine id]`` followed by ``k`` filler
    tokens (ragged lengths); it is finished when ``k`` is even. Log-probs are ``-(i + 1) / 10``.
    """

    def __init__(self, engine_id: int) -> None:
        self.engine_id = engine_id
        self.batches: list[int] = []
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.resets = 0
        self.seeds: list[list[int] | None] = []

    def generate(self, prompts, sampling, return_log_probs=True, seeds=None):
        self.batches.append(len(prompts))
        self.seeds.append(seeds)
        results = []
        for prompt in prompts:
            samples = []
            for k in range(sampling["n"]):
                tokens = [len(prompt), k, self.engine_id, *([28] * k)][: sampling["max_tokens"]]
                log_probs = [-(i + 1) / 10 for i in range(len(tokens))]
                samples.append((tokens, log_probs if return_log_probs else None, k % 2 == 0))
            results.append(samples)
        return results

    def prompt_log_probs(self, sequences):
        self.batches.append(len(sequences))
        return [[0.0] + [-(t % 7) - 0.25 for t in seq[1:]] for seq in sequences]

    def load_weights(self, named_tensors):
        self.loaded = list(named_tensors)
        self.resets += 1

    def reset_prefix_cache(self):
        self.resets += 1


def _tokens_batch(prompts: list[list[int]]) -> TensorDict:
    tokens = Tokens.from_sequences(prompt=[torch.tensor(p) for p in prompts])
    return TensorDict(
        {"tokens": tokens, "row_id": torch.arange(len(prompts))}, batch_size=[len(prompts)]
    )


def _messages(chat) -> list[tuple[str, str]]:
    """(role, content) of a History row or a list of message dicts."""
    messages = chat if isinstance(chat, list) else chat.to_chats()
    return [(m["role"], m["content"]) for m in messages]


# ---------------------------------------------------------------------- without vLLM
def test_modules_import_without_vllm_or_ray():
    code = (
        "import sys, llmrl.policies, llmrl.policies.vllm_wrapper, llmrl.policies.vllm_engine, "
        "llmrl.policies.vllm_worker_extension\n"
        "from llmrl.policies import vLLMWrapper\n"
        "assert 'vllm' not in sys.modules and 'ray' not in sys.modules, 'imported at top level'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@NO_VLLM
def test_missing_vllm_names_the_gpu_extra(tokenizer):
    from llmrl.policies.vllm_engine import VLLMEngine

    with pytest.raises(MissingExtraError, match=r"pip install 'llmrl\[gpu\]'"):
        vLLMWrapper("some/model", tokenizer)
    with pytest.raises(MissingExtraError, match=r"pip install 'llmrl\[gpu\]'"):
        VLLMEngine("x")


def test_split_evenly_is_contiguous_and_balanced():
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert split_evenly(0, 2) == [(0, 0), (0, 0)]


def test_rejects_objects_that_are_not_engines(tokenizer):
    with pytest.raises(TypeError, match="generate and prompt_log_probs"):
        vLLMWrapper(object(), tokenizer)
    with pytest.raises(ValueError, match="at least one engine"):
        vLLMWrapper([], tokenizer)


def test_prompts_split_over_engines_in_order(tokenizer):
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(
        engines, tokenizer, input_mode="tokens", generate_kwargs={"max_new_tokens": 8}
    )
    assert policy.engines == engines
    prompts = [[5] * length for length in (1, 2, 3, 4, 5)]
    out = policy(_tokens_batch(prompts))
    assert out.batch_size == torch.Size([5])
    assert [e.batches for e in engines] == [[3], [2]], "contiguous chunks, larger first"
    responses = [r.tolist() for r in out["tokens"].as_list("response")]
    assert [r[0] for r in responses] == [1, 2, 3, 4, 5], "answers back in the batch's order"
    assert [r[2] for r in responses] == [0, 0, 0, 1, 1], "rows 0-2 on engine 0, 3-4 on engine 1"
    assert out["log_probs"].as_list("response")[0].dtype == torch.float32
    assert out["tokens"].as_list("response")[0].dtype == torch.long


def test_num_samples_groups_by_prompt_with_finished_flags(tokenizer):
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(engines, tokenizer, num_samples=3, generate_kwargs={"max_new_tokens": 8})
    batch = history_batch()
    out = policy(batch)
    assert out.batch_size == torch.Size([3, 3])
    prompt_lengths = [len(p) for p in out[:, 0]["tokens"].as_list("prompt")]
    assert len(set(prompt_lengths)) == 3, "fixture: the prompts differ in length"
    for b in range(3):
        group = out[b]
        assert (group["row_id"] == b).all()
        responses = [r.tolist() for r in group["tokens"].as_list("response")]
        assert [r[0] for r in responses] == [prompt_lengths[b]] * 3, "every sample is prompt b's"
        assert [r[1] for r in responses] == [0, 1, 2], "samples in order"
        assert [len(r) for r in responses] == [3, 4, 5]
        replies = [group["history"].full[k][-1] for k in range(3)]
        assert [bool(r.is_complete) for r in replies] == [True, False, True]
        assert all(r.role == "assistant" for r in replies)
        lps = group["log_probs"].as_list("response")
        assert torch.allclose(lps[2], torch.tensor([-0.1, -0.2, -0.3, -0.4, -0.5]))
        assert _messages(group["history"].prompt[0]) == _messages(PROMPTS[b])


def test_generation_settings_reach_the_engines(tokenizer):
    seen = {}

    class Recording(FakeEngine):
        def generate(self, prompts, sampling, return_log_probs=True, seeds=None):
            seen.update(sampling, return_log_probs=return_log_probs)
            return super().generate(prompts, sampling, return_log_probs, seeds)

    policy = vLLMWrapper(
        Recording(0),
        tokenizer,
        return_log_probs=False,
        generate_kwargs={"max_new_tokens": 2, "temperature": 0.7, "stop": ["\n"], "n": 2},
    )
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 2])
    assert "log_probs" not in out
    assert seen["max_tokens"] == 2 and seen["n"] == 2 and seen["temperature"] == 0.7
    assert seen["stop"] == ["\n"] and seen["return_log_probs"] is False
    assert [len(r) for r in out.reshape(-1)["tokens"].as_list("response")] == [2] * 6


def test_scores_are_right_padded_and_split_over_engines(tokenizer):
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(engines, tokenizer)
    sequences = [torch.tensor([3, 4, 5]), torch.tensor([6]), torch.tensor([7, 8, 9, 10, 11])]
    scores = policy._score(sequences)
    assert scores.logits is None
    assert scores.log_probs.dtype == torch.float32
    assert scores.log_probs.shape == (3, 5)
    expected = torch.tensor(
        [
            [0.0, -4.25, -5.25, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, -1.25, -2.25, -3.25, -4.25],
        ]
    )
    assert torch.equal(scores.log_probs, expected)
    assert [e.batches for e in engines] == [[2], [1]]


def test_scoring_through_the_policy_api(tokenizer):
    sampler = vLLMWrapper(
        [FakeEngine(0), FakeEngine(1)],
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": 8, "n": 2},
    )
    out = sampler(_tokens_batch([[11, 12], [13, 14, 15], [16]])).reshape(-1)
    scorer = sampler.get_new_version(generate=False, pad_output=True)
    assert scorer.engines == sampler.engines, "a new version shares the engines"
    scored = scorer(out)
    full = out["tokens"].as_list("full")
    padded, real = scored["log_probs"].full, scored["masks"].full
    assert padded.shape == real.shape and padded.shape[0] == 6
    for row, tokens in enumerate(full):
        expected = [0.0] + [-(t % 7) - 0.25 for t in tokens[1:].tolist()]
        assert padded[row][real[row]].tolist() == pytest.approx(expected)
        assert (padded[row][~real[row]] == 0).all()


@pytest.mark.parametrize("name", ["logits", "entropy"])
def test_return_logits_or_entropy_is_refused(tokenizer, name):
    scorer = vLLMWrapper(
        FakeEngine(0), tokenizer, generate=False, input_mode="tokens", **{f"return_{name}": True}
    )
    td = TensorDict({"tokens": Tokens.from_sequences(full=[torch.tensor([1, 2, 3])])}, [1])
    with pytest.raises(ValueError, match=rf"vLLM does not return {name}.*TransformersWrapper"):
        scorer(td)


def test_load_weights_and_reset_reach_every_engine(tokenizer):
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(engines, tokenizer)
    weight = torch.ones(2, 2, requires_grad=True)
    policy.load_weights(iter([("w", weight)]))
    for engine in engines:
        assert [name for name, _ in engine.loaded] == ["w"]
        assert not engine.loaded[0][1].requires_grad
    policy.reset_prefix_cache()
    assert [e.resets for e in engines] == [2, 2]


def test_packed_tensors_round_trip_every_dtype():
    from llmrl.policies.vllm_worker_extension import pack_named_tensors, unpack_named_tensor

    tensors = [
        ("a", torch.randn(3, 4, dtype=torch.bfloat16)),
        ("b", torch.arange(6, dtype=torch.int64).reshape(2, 3).t()),  # non-contiguous
        ("c", torch.tensor(2.5)),
        ("d", torch.empty(0, 3)),
    ]
    packed = pack_named_tensors(tensors)
    assert all(isinstance(entry[3], bytes) for entry in packed)
    for (name, tensor), entry in zip(tensors, packed, strict=True):
        got_name, got = unpack_named_tensor(entry)
        assert got_name == name and got.dtype == tensor.dtype and torch.equal(got, tensor)


def test_weight_chunks_respect_the_byte_limit():
    from llmrl.policies.vllm_engine import _chunks_by_bytes

    tensors = [(str(i), torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([4, 4, 9, 1, 2])]
    chunks = _chunks_by_bytes(tensors, limit=8)
    assert [[name for name, _ in chunk] for chunk in chunks] == [["0", "1"], ["2"], ["3", "4"]]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for this module's Ray tests (GPUs detected, none on a CPU machine)."""
    import ray

    ray.init(include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@NEEDS_RAY
@pytest.mark.integration
def test_ray_engines_fail_clearly_when_gpus_are_missing(ray_cluster):
    from llmrl.policies.vllm_engine import create_ray_engines

    with pytest.raises(RuntimeError, match=r"needs 64 GPU\(s\).*cluster has \d+ GPU"):
        create_ray_engines(
            "some/model", num_engines=1, tensor_parallel_size=64, placement_timeout=2
        )
    states = [group["state"] for group in ray_cluster.util.placement_group_table().values()]
    assert all(state == "REMOVED" for state in states), "the unplaced group is removed"


@NEEDS_RAY
@pytest.mark.integration
def test_ray_actor_engines_keep_order_and_share_weights(ray_cluster, tokenizer):
    class RemoteFake:  # defined here so Ray ships it by value to its workers
        def __init__(self, engine_id):
            self.engine_id = engine_id
            self.loaded = []

        def generate(self, prompts, sampling, return_log_probs=True, seeds=None):
            return [
                [([len(p), k, self.engine_id], [-0.5] * 3, k == 0) for k in range(sampling["n"])]
                for p in prompts
            ]

        def prompt_log_probs(self, sequences):
            return [[0.0] + [-1.0] * (len(s) - 1) for s in sequences]

        def load_weights(self, named_tensors):
            self.loaded = [(name, float(t.sum())) for name, t in named_tensors]

        def reset_prefix_cache(self):
            pass

        def loaded_weights(self):
            return self.loaded

    actor = ray_cluster.remote(num_cpus=0)(RemoteFake)
    engines = [actor.remote(0), actor.remote(1)]
    policy = vLLMWrapper(
        engines, tokenizer, input_mode="tokens", generate_kwargs={"max_new_tokens": 4, "n": 2}
    )
    out = policy(_tokens_batch([[7] * length for length in (1, 2, 3)]))
    assert out.batch_size == torch.Size([3, 2])
    for b in range(3):
        responses = [r.tolist() for r in out[b]["tokens"].as_list("response")]
        assert responses == [[b + 1, 0, int(b >= 2)], [b + 1, 1, int(b >= 2)]]
    scored = policy.get_new_version(generate=False)(out.reshape(-1))
    assert scored["log_probs"].as_list("full")[0].tolist() == [0.0, -1.0, -1.0, -1.0]
    policy.load_weights([("w", torch.full((2, 2), 0.5))])
    assert ray_cluster.get([e.loaded_weights.remote() for e in engines]) == [[("w", 2.0)]] * 2
    policy.reset_prefix_cache()


# ---------------------------------------------------------------------- real vLLM on a GPU
ATOL_GPU = 1e-2  # fp32 on both sides; vLLM's kernels differ from transformers' (not bitwise)


@pytest.fixture(scope="module")
def model_dir():
    from llmrl.models import ensure_converted, resolve_spec

    return str(ensure_converted(resolve_spec("smollm2-135m-instruct").location))


@pytest.fixture(scope="module")
def engine(model_dir):
    from llmrl.policies.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_dir, dtype="float32", gpu_memory_utilization=0.25, enforce_eager=True, seed=0
    )


def _checkpoint(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(f"{model_dir}/model.safetensors")


def _vocab_size(model_dir: str) -> int:
    with open(f"{model_dir}/config.json") as f:
        return json.load(f)["vocab_size"]


def _hf_scorer(tokenizer):
    from llmrl.models import load_model
    from llmrl.policies import TransformersWrapper

    model = load_model("smollm2-135m-instruct", dtype=torch.float32, device="cuda")
    return TransformersWrapper(model, tokenizer, generate=False, input_mode="tokens")


def _assert_close_rows(expected, actual, atol=ATOL_GPU):
    assert [len(e) for e in expected] == [len(a) for a in actual]
    for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
        e, a = e.float().cpu(), a.float().cpu()
        assert torch.allclose(e, a, atol=atol), f"row {row}: max diff {(e - a).abs().max()}"


@GPU
def test_vllm_sampling_log_probs_match_transformers_scoring(engine, tokenizer):
    policy = vLLMWrapper(
        engine, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 24, "seed": 0}
    )
    out = policy(history_batch()).reshape(-1)
    responses = out["tokens"].as_list("response")
    assert all(len(r) > 0 for r in responses)
    sampled = out["log_probs"].as_list("response")
    assert all((lp <= 0).all() for lp in sampled)
    by_hf = _hf_scorer(tokenizer)(out)
    _assert_close_rows(sampled, by_hf["log_probs"].as_list("response"))
    # vLLM's own scoring (prompt_logprobs) agrees too, over the whole sequence
    by_vllm = policy.get_new_version(generate=False, input_mode="tokens")(out)
    _assert_close_rows(sampled, by_vllm["log_probs"].as_list("response"))
    _assert_close_rows(by_hf["log_probs"].as_list("full"), by_vllm["log_probs"].as_list("full"))
    # a response that ended on EOS keeps that token, and is complete
    for row, response in enumerate(responses):
        reply = out["history"].full[row][-1]
        if int(response[-1]) == tokenizer.eos_token_id:
            assert reply.is_complete
        elif len(response) == 24:
            assert not reply.is_complete


@GPU
def test_vllm_num_samples_are_grouped_and_distinct(engine, tokenizer):
    policy = vLLMWrapper(
        engine, tokenizer, num_samples=4, generate_kwargs={"max_new_tokens": 24, "seed": 1}
    )
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 4])
    for b in range(3):
        group = out[b]
        assert (group["row_id"] == b).all()
        assert _messages(group["history"].prompt[0]) == _messages(PROMPTS[b])
        responses = {tuple(r.tolist()) for r in group["tokens"].as_list("response")}
        assert len(responses) == 4, "the 4 samples of a prompt must differ"


@GPU
def test_vllm_stop_sequences_end_responses(engine, tokenizer):
    policy = vLLMWrapper(
        engine,
        tokenizer,
        num_samples=4,
        generate_kwargs={"max_new_tokens": 64, "stop": ["."], "seed": 0},
    )
    prompts = [[{"role": "user", "content": "Write three sentences about the sea."}]]
    out = policy(history_batch(prompts)).reshape(-1)
    stopped = 0
    for row, response in enumerate(out["tokens"].as_list("response")):
        text = tokenizer.decode(response)
        if "." in text:
            stopped += 1
            assert "." not in tokenizer.decode(response[:-1]), "stopped at the first '.'"
            assert out["history"].full[row][-1].is_complete
    assert stopped > 0, "SmolLM2 should write a '.' within 64 tokens"


@GPU
def test_vllm_load_weights_changes_outputs_and_checksum(engine, tokenizer, model_dir):
    original = _checkpoint(model_dir)
    before = engine.checksum_weights()
    assert before != 0.0
    policy = vLLMWrapper(
        engine, tokenizer, input_mode="tokens", generate_kwargs={"max_new_tokens": 8, "seed": 0}
    )
    try:
        policy.load_weights((name, torch.zeros_like(t)) for name, t in original.items())
        assert engine.checksum_weights() == 0.0
        out = policy(_tokens_batch([[1, 9690, 198], [504, 3458, 28]]))
        # all-zero weights give all-zero logits: every token has log-prob -log(vocab)
        uniform = -math.log(_vocab_size(model_dir))
        for lp in out["log_probs"].as_list("response"):
            assert torch.allclose(lp, torch.full_like(lp, uniform), atol=1e-3)
    finally:
        policy.load_weights(original.items())
    assert engine.checksum_weights() == pytest.approx(before, rel=1e-9)


@GPU
@NEEDS_RAY
@pytest.mark.integration
def test_vllm_ray_engine(ray_cluster, model_dir, tokenizer, engine):
    from llmrl.policies.vllm_engine import create_ray_engines

    engines = []
    try:
        engines = create_ray_engines(
            model_dir,
            num_engines=1,
            gpu_memory_utilization=0.25,
            dtype="float32",
            enforce_eager=True,
        )
        policy = vLLMWrapper(
            engines, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 16, "seed": 0}
        )
        out = policy(history_batch())
        assert out.batch_size == torch.Size([3, 2])
        flat = out.reshape(-1)
        scored = policy.get_new_version(generate=False, input_mode="tokens")(flat)
        _assert_close_rows(
            flat["log_probs"].as_list("response"), scored["log_probs"].as_list("response")
        )
        # the same sequences scored by the in-process engine
        local = vLLMWrapper(engine, tokenizer, generate=False, input_mode="tokens")(flat)
        _assert_close_rows(local["log_probs"].as_list("full"), scored["log_probs"].as_list("full"))
        before = ray_cluster.get(engines[0].checksum_weights.remote())
        original = _checkpoint(model_dir)
        policy.load_weights((name, torch.zeros_like(t)) for name, t in original.items())
        assert ray_cluster.get(engines[0].checksum_weights.remote()) == 0.0
        policy.load_weights(original.items())
        assert ray_cluster.get(engines[0].checksum_weights.remote()) == pytest.approx(
            before, rel=1e-9
        )
    finally:
        for actor in engines:
            ray_cluster.kill(actor)


def test_a_seed_becomes_one_seed_per_prompt_across_engines(tokenizer):
    # vLLM seeds each request: repeated GRPO prompts must not all draw the same samples.
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(engines, tokenizer, generate_kwargs={"max_new_tokens": 3, "seed": 7})
    policy(history_batch())
    assert engines[0].seeds == [[7, 8]] and engines[1].seeds == [[9]]
    unseeded = vLLMWrapper(engines, tokenizer, generate_kwargs={"max_new_tokens": 3})
    unseeded(history_batch())
    assert engines[0].seeds[-1] is None and engines[1].seeds[-1] is None
