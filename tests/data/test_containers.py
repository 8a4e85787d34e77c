"""Tokens / LogProbs / Masks / Text / ChatHistory: layouts and lossless padded <-> ragged."""

from __future__ import annotations

import pytest
import torch

from llmrl.data import ChatHistory, History, LogProbs, Text, Tokens

EOS = 2  # SmolLM2: pad == eos == <|im_end|>


def _tokens():
    return Tokens.from_sequences(
        prompt=[torch.tensor([11, 12, 13]), torch.tensor([21])],
        response=[torch.tensor([14, EOS]), torch.tensor([22, 23, 24, EOS])],
    )


def test_full_defaults_to_prompt_then_response():
    tokens = _tokens()
    assert not tokens.is_padded
    assert [r.tolist() for r in tokens.as_list("full")] == [
        [11, 12, 13, 14, EOS],
        [21, 22, 23, 24, EOS],
    ]


def test_padding_layout_prompt_left_response_right():
    padded, masks = _tokens().pad(padding_value=EOS)
    assert padded.is_padded
    assert padded.prompt.tolist() == [[11, 12, 13], [EOS, EOS, 21]]
    assert padded.response.tolist() == [[14, EOS, EOS, EOS], [22, 23, 24, EOS]]
    assert padded.full.tolist() == [
        [11, 12, 13, 14, EOS, EOS, EOS],
        [EOS, EOS, 21, 22, 23, 24, EOS],
    ]
    assert masks.full.tolist() == [
        [True, True, True, True, True, False, False],
        [False, False, True, True, True, True, True],
    ]
    # the response starts at the same column in every row
    assert masks.prompt.shape[1] == 3


def test_unpad_keeps_real_end_of_turn_tokens_equal_to_pad():
    padded, masks = _tokens().pad(padding_value=EOS)
    back = padded.unpad(masks)
    assert [r.tolist() for r in back.as_list("response")] == [[14, EOS], [22, 23, 24, EOS]]
    assert [r.tolist() for r in back.as_list("prompt")] == [[11, 12, 13], [21]]
    assert [r.tolist() for r in back.as_list("full")] == [
        [11, 12, 13, 14, EOS],
        [21, 22, 23, 24, EOS],
    ]


def test_full_only_is_right_padded():
    tokens = Tokens.from_sequences(full=[torch.tensor([1, 2]), torch.tensor([3])])
    padded, masks = tokens.pad(0)
    assert padded.full.tolist() == [[1, 2], [3, 0]]
    assert padded.prompt is None and masks.prompt is None


def test_log_probs_pad_with_zero_and_round_trip():
    log_probs = LogProbs.from_sequences(
        response=[torch.tensor([-0.5, -1.5]), torch.tensor([-0.25])]
    )
    padded, masks = log_probs.pad(0.0)
    assert padded.response.tolist() == [[-0.5, -1.5], [-0.25, 0.0]]
    assert [r.tolist() for r in padded.unpad(masks).as_list("response")] == [[-0.5, -1.5], [-0.25]]


def test_container_errors():
    with pytest.raises(ValueError, match=r"different batch sizes \{'prompt': 2, 'response': 1\}"):
        Tokens.from_sequences(
            prompt=[torch.tensor([1]), torch.tensor([2])], response=[torch.tensor([3])]
        )
    with pytest.raises(ValueError, match="needs at least one of"):
        LogProbs.from_sequences()
    padded, masks = _tokens().pad(0)
    with pytest.raises(ValueError, match=r"is padded; call .unpad\(masks\) first"):
        padded.as_list("full")
    with pytest.raises(ValueError, match="already ragged"):
        _tokens().unpad(masks)
    masks.response = None
    with pytest.raises(ValueError, match=r"masks\.response is missing"):
        padded.unpad(masks)


def test_text_full_is_prompt_plus_response():
    text = Text.from_strings(prompt=["Q: 1+1\nA:", "Q: é"], response=[" 2", " ✓"])
    assert list(text.full) == ["Q: 1+1\nA: 2", "Q: é ✓"]
    assert text[1].response == " ✓"
    with pytest.raises(ValueError, match="different batch sizes"):
        Text.from_strings(prompt=["a", "b"], response=["c"])


def test_chat_history_full_extends_the_prompt():
    prompt = History.from_chats(
        [
            [{"role": "user", "content": "a"}],
            [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}],
        ]
    )
    response = History.from_messages(
        [
            {"role": "assistant", "content": "ra"},
            {"role": "assistant", "content": "rb", "is_complete": False},
        ]
    )
    chat = ChatHistory.from_histories(prompt, response)
    assert chat.batch_size == torch.Size([2])
    assert [m["content"] for m in chat.full[1].to_chats()] == ["s", "b", "rb"]
    assert chat.full[1].is_complete.tolist() == [True, True, False]
    assert chat[0].prompt.to_chats() == [{"role": "user", "content": "a", "is_complete": True}]
