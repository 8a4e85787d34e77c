"""GenerationKwargs: aliases, validation messages, backend mappings."""

from __future__ import annotations

import pytest

from llmrl.policies import GenerationKwargs, GenerationKwargsError


def test_aliases_map_to_standard_names():
    config = GenerationKwargs.from_kwargs(max_tokens=64, n=4, stop="\n\n")
    assert (config.max_new_tokens, config.num_return_sequences) == (64, 4)
    assert config.stop_sequences == ("\n\n",)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, r"temperature must be >= 0, got -0\.1"),
        ({"top_p": 1.5}, r"top_p must be in \[0, 1\], got 1\.5"),
        ({"top_p": -0.01}, r"top_p must be in \[0, 1\], got -0\.01"),
        ({"top_k": 0}, "top_k must be >= 1, got 0"),
        ({"top_k": -5}, "top_k must be >= 1, got -5"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0, got 0"),
        ({"repetition_penalty": -1.0}, r"repetition_penalty must be > 0, got -1\.0"),
        ({"do_sample": False, "temperature": 0.7}, r"do_sample=False .* temperature=0\.7"),
        ({"temperature": 0}, "temperature=0 means greedy"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"max_tokens": 2.5}, r"max_new_tokens must be an integer, got 2\.5"),
        ({"n": 0}, "num_return_sequences must be >= 1, got 0"),
        ({"stop_sequences": [""]}, "stop_sequences must be a list of non-empty strings"),
        ({"beam_width": 3}, r"unknown generation kwarg 'beam_width'; known: .*max_tokens"),
        ({"n": 2, "num_return_sequences": 3}, "'num_return_sequences' and its alias both set"),
    ],
)
def test_validation_errors_name_the_setting(kwargs, match):
    with pytest.raises(GenerationKwargsError, match=match):
        GenerationKwargs.from_kwargs(kwargs)


def test_greedy_settings():
    config = GenerationKwargs.from_kwargs(do_sample=False)
    assert config.effective_temperature == 0.0
    hf = config.to_transformers()
    assert hf["do_sample"] is False and "temperature" not in hf
    assert config.to_vllm()["temperature"] == 0.0


def test_backend_mappings():
    config = GenerationKwargs.from_kwargs(
        max_new_tokens=8, n=2, temperature=0.5, top_p=0.9, stop_sequences=["</a>"], seed=3
    )
    assert config.to_transformers() == {
        "max_new_tokens": 8,
        "num_return_sequences": 2,
        "do_sample": True,
        "repetition_penalty": 1.0,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 0,
        "stop_strings": ["</a>"],
    }
    vllm = config.to_vllm()
    assert (vllm["max_tokens"], vllm["n"], vllm["top_k"], vllm["stop"], vllm["seed"]) == (
        8,
        2,
        -1,
        ["</a>"],
        3,
    )


def test_replace_revalidates():
    config = GenerationKwargs()
    assert config.replace(n=3).num_return_sequences == 3
    with pytest.raises(GenerationKwargsError, match="top_p"):
        config.replace(top_p=2.0)
