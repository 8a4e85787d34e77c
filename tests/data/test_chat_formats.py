"""Rendering and parsing of the built-in chat formats, against hand-written text."""

from __future__ import annotations

import pytest

from llmrl.data import CHATML, LLAMA3, ChatFormatError, detect_chat_format, get_chat_format

TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]


def _complete(messages):
    return [{**m, "is_complete": m.get("is_complete", True)} for m in messages]


def test_chatml_render_matches_hand_written_text():
    text = CHATML.render(TWO_TURNS[:3])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )
    assert CHATML.render(TWO_TURNS[:2], add_generation_prompt=True).endswith(
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama3_render_matches_hand_written_text():
    text = LLAMA3.render(TWO_TURNS[1:3])
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
    )


@pytest.mark.parametrize("fmt", [CHATML, LLAMA3], ids=lambda f: f.name)
@pytest.mark.parametrize(
    "messages",
    [
        TWO_TURNS[1:3],
        TWO_TURNS,
        [{"role": "user", "content": "Grüße, 你好, emoji 🚀 and \u200b zero-width"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "user", "content": "  leading\n\nand trailing  \n"}],
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "cut of", "is_complete": False},
        ],
    ],
    ids=["single", "multi", "unicode", "empty", "whitespace", "incomplete"],
)
def test_render_then_parse_is_exact(fmt, messages):
    incomplete = not messages[-1].get("is_complete", True)
    text = fmt.render(messages, final_incomplete=incomplete)
    assert fmt.parse(text) == _complete(messages)


def test_incomplete_message_renders_without_end_of_turn():
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "cut"}]
    assert CHATML.render(messages, final_incomplete=True).endswith("<|im_start|>assistant\ncut")


def test_generation_prompt_parses_as_empty_incomplete_assistant():
    text = CHATML.render([{"role": "user", "content": "q"}], add_generation_prompt=True)
    assert CHATML.parse(text)[-1] == {"role": "assistant", "content": "", "is_complete": False}


@pytest.mark.parametrize(
    ("fmt", "text", "match"),
    [
        (CHATML, "hello<|im_start|>user\nx<|im_end|>\n", r"turn header .* at offset 0"),
        (
            CHATML,
            "<|im_start|>user\nx<|im_end|>junk",
            r"expected '\\n' after end-of-turn at offset 28",
        ),
        (LLAMA3, "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>", "must start with"),
        (CHATML, "<|im_start|>user\nx<|im_end|>\n<|im_start|>no newline", "at offset 29"),
    ],
)
def test_parse_errors_name_the_offset(fmt, text, match):
    with pytest.raises(ChatFormatError, match=match):
        fmt.parse(text)


def test_format_lookup_and_detection(tokenizer):
    assert get_chat_format("llama3") is LLAMA3
    with pytest.raises(ChatFormatError, match=r"unknown chat format 'vicuna'.*chatml"):
        get_chat_format("vicuna")
    assert detect_chat_format(tokenizer.chat_template) is CHATML
    assert detect_chat_format("{{ '<|start_header_id|>' }}{{ '<|eot_id|>' }}") is LLAMA3
    assert detect_chat_format("{{ messages }}") is None
    assert detect_chat_format(None) is None
