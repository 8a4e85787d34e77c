"""`ScoreRequest`: one (prompt, response, reference) to score, as plain picklable data.

A request is what every text scorer (a reward model, a judge) reads, whatever process it runs
in: the chat up to the response being scored, the response, and the row's reference answer.
:func:`requests_from_batch` builds one per row of an env batch.

Example:
    >>> from tensordict import NonTensorStack, TensorDict
    >>> from llmrl.data import ChatHistory, History
    >>> chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]]
    >>> td = TensorDict({"answer": NonTensorStack("4")}, batch_size=[1])
    >>> _ = td.set("history", ChatHistory(full=History.from_chats(chats), batch_size=[1]))
    >>> requests_from_batch(td)
    [{'prompt': [{'role': 'user', 'content': '2+2?'}], 'response': '4', 'reference': '4'}]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from llmrl.data.non_tensor import as_list

if TYPE_CHECKING:
    from tensordict import TensorDictBase


class ChatMessage(TypedDict):
    """One message of a request's prompt."""

    role: str
    content: str


class ScoreRequest(TypedDict):
    """One response to score: ``prompt`` (the chat up to it), ``response`` (the policy's
    reply) and ``reference`` (the row's reference answer, None when the row has none)."""

    prompt: list[ChatMessage]
    response: str
    reference: str | None


def request_from_chat(chat: list[dict], reference: str | None = None) -> ScoreRequest:
    """The request scoring the last assistant message of ``chat``: the messages before it are
    the prompt. A chat without an assistant message scores an empty response to all of it."""
    last = next(
        (i for i in range(len(chat) - 1, -1, -1) if chat[i]["role"] == "assistant"), len(chat)
    )
    response = chat[last]["content"] if last < len(chat) else ""
    prompt = [
        ChatMessage(role=str(message["role"]), content=str(message["content"]))
        for message in chat[:last]
    ]
    return ScoreRequest(prompt=prompt, response=str(response), reference=reference)


def requests_from_batch(
    td: TensorDictBase, history_key: str = "history", answer_key: str = "answer"
) -> list[ScoreRequest]:
    """One request per row of an env batch ``[B]``: the last assistant reply of
    ``(history_key, "full")`` and the chat before it; ``answer_key``'s value (as a string) is
    the reference, None for every row when the batch has no such key."""
    chats = td.get((history_key, "full")).to_chats()
    if answer_key in td.keys():  # noqa: SIM118 (no `in` on tensordicts)
        references: list[str | None] = [str(a) for a in as_list(td.get(answer_key))]
    else:
        references = [None] * len(chats)
    return [
        request_from_chat(chat, reference)
        for chat, reference in zip(chats, references, strict=True)
    ]
