"""ScoringPolicyFactory: a model role's policy from its model (transformers here; vLLM's CPU
build in tests/vllm/test_model_scorers.py) or from a served URL, checked and picklable."""

from __future__ import annotations

import pickle

import pytest
import torch

from llmrl.policies import TransformersWrapper
from llmrl.policies.remote_vllm import RemoteVLLMEngine
from llmrl.policies.vllm_wrapper import vLLMWrapper
from llmrl.scorers.policy_factory import ScoringPolicyFactory, close_policy


def test_a_transformers_role_loads_its_model_frozen_where_asked(tiny_model_dir):
    factory = ScoringPolicyFactory(model=str(tiny_model_dir), dtype="bfloat16", threads=1)
    assert pickle.loads(pickle.dumps(factory)) == factory
    previous = torch.get_num_threads()
    try:
        policy = factory()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
    assert isinstance(policy, TransformersWrapper)
    parameters = list(policy.model.parameters())
    assert {p.dtype for p in parameters} == {torch.bfloat16}
    assert not any(p.requires_grad for p in parameters)
    assert not policy.model.training
    assert policy.device == torch.device("cpu")
    assert policy.tokenizer.name_or_path == str(tiny_model_dir)


def test_a_url_role_drives_the_served_model_with_the_named_tokenizer(tiny_model_dir):
    factory = ScoringPolicyFactory(
        url="http://127.0.0.1:9/v1", served_model="judge", tokenizer=str(tiny_model_dir)
    )
    assert (factory.name, factory.tokenizer_spec) == ("http://127.0.0.1:9/v1", str(tiny_model_dir))
    policy = factory()  # nothing is reached until a call: the served name is given
    assert isinstance(policy, vLLMWrapper)
    [engine] = policy.engines
    assert isinstance(engine, RemoteVLLMEngine)
    assert (engine.url, engine.model) == ("http://127.0.0.1:9", "judge")
    close_policy(policy)
    assert engine._client.is_closed


def test_a_url_role_without_a_tokenizer_spec_is_told_what_to_set():
    factory = ScoringPolicyFactory(url="http://judge:8000")
    with pytest.raises(ValueError, match=r"set tokenizer .* or served_model"):
        factory.tokenizer_spec  # noqa: B018
    served = ScoringPolicyFactory(url="http://judge:8000", served_model="org/judge")
    assert served.tokenizer_spec == "org/judge"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of model .* and url"),
        ({"model": "m", "url": "http://x:1"}, "exactly one of model .* and url"),
        ({"url": "judge:8000"}, "url must start with http:// or https://"),
        ({"model": "m", "backend": "sglang"}, r"backend must be one of \['transformers', 'vllm'\]"),
    ],
)
def test_a_malformed_role_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ScoringPolicyFactory(**fields)


class _Engine:
    def __init__(self) -> None:
        self.closed = 0

    def generate(self, *args):
        raise AssertionError("not called")

    def prompt_log_probs(self, *args):
        raise AssertionError("not called")

    def close(self) -> None:
        self.closed += 1


def test_close_policy_stops_the_batcher_and_the_engines_it_holds(tokenizer):
    engines = [_Engine(), _Engine()]
    policy = vLLMWrapper(engines, tokenizer, min_batch_size=2)
    close_policy(policy)
    assert [engine.closed for engine in engines] == [1, 1]
    assert policy._batcher is not None and policy._batcher._closed


def test_a_topology_role_gives_its_model_backend_dtype_and_engine_settings():
    from llmrl.topology.model_roles import ModelRoleSpec

    role = ModelRoleSpec(
        model="teacher-dir",
        backend="vllm",
        dtype="float16",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.4,
        cpu_kv_cache_gb=3.0,
        enforce_eager=True,
    )
    factory = ScoringPolicyFactory.from_role(role, seed=7, load_options={"trust_remote_code": True})
    assert factory == ScoringPolicyFactory(
        model="teacher-dir",
        backend="vllm",
        dtype="float16",
        device="cuda",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.4,
        cpu_kv_cache_gb=3.0,
        enforce_eager=True,
        seed=7,
        load_options={"trust_remote_code": True},
    )
    on_cpu = ScoringPolicyFactory.from_role(ModelRoleSpec(model="judge", backend="transformers"))
    assert (on_cpu.backend, on_cpu.device, on_cpu.dtype) == ("transformers", "cpu", "bfloat16")
    served = ScoringPolicyFactory.from_role(
        ModelRoleSpec(url="http://judge:8000", served_model="judge"), tokenizer="judge-dir"
    )
    assert (served.url, served.served_model, served.tokenizer_spec, served.model) == (
        "http://judge:8000",
        "judge",
        "judge-dir",
        None,
    )
