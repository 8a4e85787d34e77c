"""Tokenization with assistant masks: exact for ragged, multi-turn, unicode and cut-off chats."""

from __future__ import annotations

import pytest
import torch

from llmrl.data import ChatTemplateError, History

CHATS = [
    [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Und 3+3? ✓"},
        {"role": "assistant", "content": "  6, naïvely\n\n"},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
    [
        {"role": "user", "content": "story"},
        {"role": "assistant", "content": "Once 🚀 upon", "is_complete": False},
    ],
    [{"role": "user", "content": "no answer yet"}],
]
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", None: "<|im_end|>"}


def _expected_assistant_text(chat, end_of_turn):
    return [
        m["content"] + (end_of_turn if m.get("is_complete", True) else "")
        for m in chat
        if m["role"] == "assistant"
    ]


def _masked_runs(tokenizer, ids, mask):
    """Decode each contiguous run of masked tokens."""
    runs, current = [], []
    for token, inside in zip(ids.tolist(), mask.tolist(), strict=True):
        if inside:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run) for run in runs]


@pytest.mark.parametrize(
    "template", [None, "chatml", "llama3"], ids=["tokenizer", "chatml", "llama3"]
)
def test_masked_tokens_decode_to_assistant_content_plus_end_of_turn(tokenizer, template):
    tokens = History.from_chats(CHATS).apply_chat_template(tokenizer, chat_template=template)
    assert tokens.batch_size == torch.Size([4])
    for row, chat in enumerate(CHATS):
        expected = [t for t in _expected_assistant_text(chat, END_OF_TURN[template]) if t]
        assert (
            _masked_runs(tokenizer, tokens[row].input_ids, tokens[row].assistant_mask) == expected
        )


def test_headers_and_separators_are_never_masked(tokenizer):
    tokens = History.from_chats(CHATS[:1]).apply_chat_template(tokenizer)[0]
    masked = set(tokens.input_ids[tokens.assistant_mask].tolist())
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assistant = tokenizer("assistant", add_special_tokens=False)["input_ids"]
    assert im_start not in masked
    assert not set(assistant) & masked
    # the "\n" after each <|im_end|> belongs to the template, not to the assistant
    ids, mask = tokens.input_ids.tolist(), tokens.assistant_mask.tolist()
    im_end = tokenizer.eos_token_id
    for position, token in enumerate(ids[:-1]):
        if token == im_end and mask[position]:
            assert not mask[position + 1]


def test_whole_text_is_covered_by_the_tokens(tokenizer):
    history = History.from_chats(CHATS)
    texts = history.apply_chat_template(tokenizer, tokenize=False)
    tokens = history.apply_chat_template(tokenizer)
    for row, text in enumerate(texts):
        assert tokenizer.decode(tokens[row].input_ids) == text


def test_prompt_tokens_are_a_prefix_of_the_full_conversation(tokenizer):
    # What the policy sees before generating must line up token for token with the full chat.
    chat = CHATS[0]
    prompt = History.from_messages(chat[:-1]).apply_chat_template(
        tokenizer, add_generation_prompt=True
    )
    full = History.from_messages(chat).apply_chat_template(tokenizer)
    prompt_len = prompt.input_ids.numel()
    assert torch.equal(full.input_ids[:prompt_len], prompt.input_ids)
    assert not full.assistant_mask[:prompt_len][-1]
    assert full.assistant_mask[prompt_len:].sum() > 0


def test_padded_equals_ragged(tokenizer):
    history = History.from_chats(CHATS)
    ragged = history.apply_chat_template(tokenizer)
    padded = history.apply_chat_template(tokenizer, padded=True)
    lengths = [ragged[i].input_ids.numel() for i in range(len(CHATS))]
    assert padded.input_ids.shape == (4, max(lengths))
    assert padded.attention_mask.sum(1).tolist() == lengths
    for row, length in enumerate(lengths):
        assert torch.equal(padded.input_ids[row, :length], ragged[row].input_ids)
        assert torch.equal(padded.assistant_mask[row, :length], ragged[row].assistant_mask)
        assert not padded.assistant_mask[row, length:].any()
        assert (padded.input_ids[row, length:] == tokenizer.pad_token_id).all()


def test_single_conversation_gives_unbatched_tokens(tokenizer):
    tokens = History.from_messages(CHATS[1]).apply_chat_template(tokenizer)
    assert tokens.batch_size == torch.Size([])
    assert tokens.input_ids.dim() == 1


def test_template_that_rewrites_history_is_refused(tokenizer):
    # A template that drops earlier assistant turns (as reasoning templates do) cannot be masked.
    clone = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    clone.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match=r"message 2 .*append-only"):
        History.from_messages(CHATS[0]).apply_chat_template(clone)


def test_tokenizer_without_template_needs_a_format(tokenizer):
    clone = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    clone.chat_template = None
    with pytest.raises(ChatTemplateError, match="pass chat_template='chatml'"):
        History.from_messages(CHATS[1]).apply_chat_template(clone)
    tokens = History.from_messages(CHATS[1]).apply_chat_template(clone, chat_template="chatml")
    assert clone.decode(tokens.input_ids) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    )
