"""What `VLLMEngine` asks of ``vllm.LLM`` on vLLM's CPU build, without vLLM: a stand-in
``vllm`` module records the options (the engine itself runs in tests/vllm)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from llmrl.policies import vllm_engine
from llmrl.policies.vllm_engine import CPU_KV_CACHE_VARIABLE, VLLMEngine

GIB = 2**30


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options of every ``vllm.LLM`` built by a VLLMEngine on a CPU build, in order."""
    options: list[dict[str, Any]] = []

    class RecordingLLM:
        def __init__(self, **kwargs: Any) -> None:
            options.append(kwargs)

    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: SimpleNamespace(LLM=RecordingLLM))
    monkeypatch.setattr(vllm_engine, "vllm_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_engine.vllm_file_transfer, "register", lambda: None)
    monkeypatch.setattr(vllm_engine, "_model_location", str)
    monkeypatch.delenv(CPU_KV_CACHE_VARIABLE, raising=False)
    return options


def test_a_fractional_kv_cache_is_given_in_bytes_and_each_engine_gets_its_own(built):
    # vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): "0.5" would fail the engine's start
    VLLMEngine("tiny", cpu_kv_cache_gb=0.5)
    VLLMEngine("tiny", cpu_kv_cache_gb=2.5)
    # an explicit vllm.LLM argument wins
    VLLMEngine("tiny", cpu_kv_cache_gb=0.5, kv_cache_memory_bytes=123)
    assert [o["kv_cache_memory_bytes"] for o in built] == [GIB // 2, 5 * GIB // 2, 123]
    assert CPU_KV_CACHE_VARIABLE not in os.environ  # no engine sizes the next one
    assert all(o["enforce_eager"] is True for o in built)  # eager on CPU by default


def test_the_variable_when_set_sizes_the_cache_and_on_gpus_neither_is_given(
    built, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(CPU_KV_CACHE_VARIABLE, "3")
    VLLMEngine("tiny", cpu_kv_cache_gb=0.5)
    monkeypatch.delenv(CPU_KV_CACHE_VARIABLE)
    monkeypatch.setattr(vllm_engine, "vllm_on_cpu", lambda: False)
    VLLMEngine("tiny", cpu_kv_cache_gb=0.5)
    assert ["kv_cache_memory_bytes" in o for o in built] == [False, False]
