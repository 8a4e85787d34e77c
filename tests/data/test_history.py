"""History: construction, round trips through dicts and text, editing, validation."""

from __future__ import annotations

import pytest
import torch
from tensordict import set_list_to_stack

from llmrl.data import History

SYSTEM = {"role": "system", "content": "You add numbers."}
CHAT_A = [
    SYSTEM,
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Now ünïcödé ✓ and 3+3?"},
    {"role": "assistant", "content": "6"},
]
CHAT_B = [SYSTEM, {"role": "user", "content": ""}]
CHAT_C = [
    SYSTEM,
    {"role": "user", "content": "Write a long story"},
    {"role": "assistant", "content": "Once upon a", "is_complete": False},
]


def _normalized(chat):
    return [{**m, "is_complete": m.get("is_complete", True)} for m in chat]


def test_ragged_batch_shape_and_indexing():
    history = History.from_chats([CHAT_A, CHAT_B, CHAT_C])
    assert history.batch_size == torch.Size([3, -1])
    assert history[0].batch_size == torch.Size([5])
    assert history[1].batch_size == torch.Size([2])
    assert history[0][3].content == "Now ünïcödé ✓ and 3+3?"
    assert history[2].is_complete.tolist() == [True, True, False]


def test_dicts_round_trip_exactly():
    chats = [CHAT_A, CHAT_B, CHAT_C]
    assert History.from_chats(chats).to_chats() == [_normalized(c) for c in chats]
    assert History.from_chats(CHAT_A).to_chats() == _normalized(CHAT_A)
    assert History.message("user", "hi").to_chats() == {
        "role": "user",
        "content": "hi",
        "is_complete": True,
    }


def test_tool_calls_survive_round_trip():
    calls = [{"name": "python", "arguments": {"code": "print(1)"}}]
    chat = [
        {"role": "user", "content": "run"},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]
    assert History.from_messages(chat).to_chats()[1]["tool_calls"] == calls


def test_does_not_depend_on_the_global_list_to_stack_flag():
    with set_list_to_stack(False):
        history = History.from_chats([CHAT_A, CHAT_B])
        assert history[1][1].role == "user"
        assert history.to_chats() == [_normalized(CHAT_A), _normalized(CHAT_B)]


@pytest.mark.parametrize("chats", [[CHAT_A], [CHAT_A, CHAT_B, CHAT_C]], ids=["one", "ragged"])
def test_text_round_trip_with_the_tokenizers_template(tokenizer, chats):
    history = History.from_chats(chats)
    texts = history.apply_chat_template(tokenizer, tokenize=False)
    assert History.from_text(texts, chat_format="chatml").to_chats() == history.to_chats()


@pytest.mark.parametrize("fmt", ["chatml", "llama3"])
def test_text_round_trip_with_built_in_formats(tokenizer, fmt):
    history = History.from_chats([CHAT_A, CHAT_B, CHAT_C])
    texts = history.apply_chat_template(tokenizer, chat_template=fmt, tokenize=False)
    assert History.from_text(texts, chat_format=fmt).to_chats() == history.to_chats()


def test_smollm2_template_injects_its_default_system_prompt(tokenizer):
    # SmolLM2's own template adds a system message when the chat has none; parsing shows it.
    text = History.from_messages([{"role": "user", "content": "hi"}]).apply_chat_template(
        tokenizer, tokenize=False, add_generation_prompt=True
    )
    parsed = History.from_text(text).to_chats()
    assert [m["role"] for m in parsed] == ["system", "user", "assistant"]
    assert parsed[-1] == {"role": "assistant", "content": "", "is_complete": False}


def test_append_and_extend_on_a_conversation():
    chat = History.from_messages(CHAT_B)
    longer = chat.append(History.message("assistant", "ok"))
    assert [m["content"] for m in longer.to_chats()] == ["You add numbers.", "", "ok"]
    extended = chat.extend(History.from_messages(CHAT_A[2:]))
    assert extended.batch_size == torch.Size([5])
    assert chat.batch_size == torch.Size([2]), "append/extend must not modify the original"


def test_append_and_extend_on_a_ragged_batch():
    batch = History.from_chats([CHAT_A, CHAT_B])
    replies = History.from_messages(
        [{"role": "assistant", "content": "r0"}, {"role": "assistant", "content": "r1"}]
    )
    appended = batch.append(replies).to_chats()
    assert [len(c) for c in appended] == [6, 3]
    assert appended[0][-1]["content"] == "r0" and appended[1][-1]["content"] == "r1"

    more = History.from_chats([[{"role": "tool", "content": "t"}], CHAT_A[1:3]])
    extended = batch.extend(more).to_chats()
    assert [len(c) for c in extended] == [6, 4]
    assert extended[1][2:] == _normalized(CHAT_A[1:3])


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: History.from_chats([CHAT_A, "oops"]), TypeError, "chat 1, expected a list"),
        (lambda: History.from_chats([CHAT_A, []]), ValueError, "chat 1, a conversation needs"),
        (
            lambda: History.from_chats([[{"role": "user"}]]),
            ValueError,
            "chat 0, message 0: missing field 'content'",
        ),
        (
            lambda: History.from_chats([CHAT_B, [{"role": "user", "content": 3}]]),
            TypeError,
            "chat 1, message 0: field 'content' must be a string, got int",
        ),
        (
            lambda: History.from_messages([{"role": "", "content": "x"}]),
            ValueError,
            "message 0: field 'role' is empty",
        ),
        (
            lambda: History.from_messages([{"role": "user", "content": "x", "name": "bob"}]),
            ValueError,
            r"message 0: unknown keys \['name'\]",
        ),
        (
            lambda: History.from_messages([{"role": "user", "content": "x", "is_complete": 1}]),
            TypeError,
            "'is_complete' must be a bool",
        ),
        (lambda: History.from_chats([]), ValueError, "at least one conversation"),
    ],
)
def test_bad_messages_are_rejected_with_their_location(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_edit_shape_errors():
    batch = History.from_chats([CHAT_A, CHAT_B])
    with pytest.raises(ValueError, match="batch sizes differ: 2 conversations but 3 rows"):
        batch.append(History.from_messages([SYSTEM, SYSTEM, SYSTEM]))
    with pytest.raises(ValueError, match=r"takes messages of batch size \[B\]"):
        batch.append(History.message("user", "x"))
    with pytest.raises(ValueError, match="takes a single message"):
        History.from_messages(CHAT_B).append(History.from_messages(CHAT_B))
