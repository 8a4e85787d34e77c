"""The chat data model: `History`, output containers, chat templates and padding conventions.

Layer 1 (data, models, topology, tracking): imports core and config.
"""

from llmrl.data.chat_formats import (
    CHAT_FORMATS,
    CHATML,
    LLAMA3,
    ChatFormat,
    ChatFormatError,
    detect_chat_format,
    get_chat_format,
)
from llmrl.data.chat_tokens import ChatTemplateError, ChatTokens, render_chats, tokenize_chats
from llmrl.data.containers import ChatHistory, LogProbs, Masks, Text, Tokens
from llmrl.data.history import History
from llmrl.data.padding import pad_sequences, unpad_sequences

__all__ = [
    "CHATML",
    "CHAT_FORMATS",
    "LLAMA3",
    "ChatFormat",
    "ChatFormatError",
    "ChatHistory",
    "ChatTemplateError",
    "ChatTokens",
    "History",
    "LogProbs",
    "Masks",
    "Text",
    "Tokens",
    "detect_chat_format",
    "get_chat_format",
    "pad_sequences",
    "render_chats",
    "tokenize_chats",
    "unpad_sequences",
]
