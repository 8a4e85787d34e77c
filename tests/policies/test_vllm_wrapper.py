"""vLLMWrapper without vLLM: imports, engine split/merge and weight fan-out (fake engines).

The split/merge logic is backend-independent, so it runs everywhere against fake engines that
speak VLLMEngine's plain-data API. The real engine (vLLM's CPU build) is tested in tests/vllm,
in the stage environment.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from llmrl.core.errors import MissingExtraError
from llmrl.data import Tokens
from llmrl.policies.vllm_wrapper import split_evenly, vLLMWrapper
from tests.support.chats import PROMPTS, history_batch

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

    def load_weights(self, named_tensors, version=None):
        self.loaded = list(named_tensors)
        self.version = version
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
        "llmrl.policies.vllm_worker_extension, llmrl.policies.vllm_file_transfer, "
        "llmrl.policies.remote_vllm, llmrl.stages.evaluate\n"
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
        # the fake engine's float64 log-probs stored as float32, as the literals are: equal
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
        # the fake engine's log-probs are quarters: exact in float32
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
    policy.load_weights(iter([("w", weight)]), version=4)
    for engine in engines:
        assert [name for name, _ in engine.loaded] == ["w"] and engine.version == 4
        assert not engine.loaded[0][1].requires_grad
    policy.reset_prefix_cache()
    assert [e.resets for e in engines] == [2, 2]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for this module's Ray tests (GPUs detected, none on a CPU machine)."""
    import ray

    ray.init(include_dashboard=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


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

        def load_weights(self, named_tensors, version=None):
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


def test_a_seed_becomes_one_seed_per_prompt_across_engines(tokenizer):
    # vLLM seeds each request: repeated GRPO prompts must not all draw the same samples.
    engines = [FakeEngine(0), FakeEngine(1)]
    policy = vLLMWrapper(engines, tokenizer, generate_kwargs={"max_new_tokens": 3, "seed": 7})
    policy(history_batch())
    assert engines[0].seeds == [[7, 8]] and engines[1].seeds == [[9]]
    unseeded = vLLMWrapper(engines, tokenizer, generate_kwargs={"max_new_tokens": 3})
    unseeded(history_batch())
    assert engines[0].seeds[-1] is None and engines[1].seeds[-1] is None
