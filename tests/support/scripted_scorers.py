"""Scripted text scorers for the model-role tests: picklable factories a Ray actor (or a
client's own process) calls to build them."""

from __future__ import annotations

import time
from dataclasses import dataclass


class LengthScorer:
    """Scores a request with its response's length; records the size of every call."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[int] = []

    def __call__(self, requests: list[dict]) -> list[float]:
        self.calls.append(len(requests))
        time.sleep(self.delay_s)
        return [float(len(r["response"])) for r in requests]


@dataclass(frozen=True)
class LengthScorerFactory:
    """Builds a :class:`LengthScorer` answering after ``delay_s`` seconds (picklable)."""

    delay_s: float = 0.0
    name: str = "scripted-length"

    def __call__(self) -> LengthScorer:
        return LengthScorer(self.delay_s)


@dataclass(frozen=True)
class BrokenFactory:
    """A scorer that cannot be built (its model is missing)."""

    def __call__(self) -> LengthScorer:
        raise FileNotFoundError("no model at /nowhere")


def request(response: str, prompt: str = "2+2?", reference: str | None = "4") -> dict:
    """One score request with a user prompt."""
    return {"prompt": [{"role": "user", "content": prompt}], "response": response,
            "reference": reference}  # fmt: skip
