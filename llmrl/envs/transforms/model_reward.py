"""`ModelReward`: a model's score of each final reply (a reward model's, a judge's verdict).

On each step the transform builds a :class:`~llmrl.scorers.requests.ScoreRequest` for every
row whose episode ends with this reply, sends them to its scorer (a
:class:`~llmrl.scorers.client.ModelClient`, or any ``list[ScoreRequest] -> list[float | None]``)
in requests of at most ``max_rows_per_request`` rows, and adds ``weight * score`` to
``reward``. A row's episode ends with this reply unless the reply called a tool (a transform
with ``is_tool`` answered it) and turns are left (``max_turns``, the env's): intermediate
replies of a multi-turn episode are not scored.

Faults never raise: a request that failed (its client's :class:`ModelCallError` after the
retries, or any other error of the scorer) and a None score (a judge's answer without a
verdict), or a score that is not finite, give the row ``fallback_reward`` and ``failed = True``.

With ``normalize`` the scores of the rows that did not fail are z-scored over the batch
(population std; all 0 when they are all equal) before weighting; fallback rewards are not.

Writes ``<name>_score`` (float ``[B]``: the model's raw score, the fallback reward on a failed
row, 0 on a row not scored) and ``<name>_failed`` (bool ``[B]``).

Example (hand-computed): scores 1 and 3 normalise to -1 and +1; weight 0.5 adds -0.5 and 0.5:

    >>> from tensordict import TensorDict
    >>> from llmrl.data import ChatHistory, History
    >>> chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    >>> td = TensorDict({"reward": torch.zeros(2)}, batch_size=[2])
    >>> _ = td.set("history", ChatHistory(full=History.from_chats([chat, chat]), batch_size=[2]))
    >>> scores = iter([[1.0, 3.0]])
    >>> reward = ModelReward("reward_model", lambda rows: next(scores), weight=0.5, normalize=True)
    >>> reward.on_step(td)["reward"].tolist()
    [-0.5, 0.5]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from llmrl.envs.transforms.base import EnvTransform
from llmrl.scorers.requests import requests_from_batch

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from llmrl.scorers.requests import ScoreRequest

logger = logging.getLogger(__name__)

MODEL_REWARD_NAMES = ("reward_model", "judge")

Scorer = Callable[[list["ScoreRequest"]], Sequence["float | None"]]


class ModelReward(EnvTransform):
    """Adds a model's weighted score of each final reply to ``reward`` (see the module
    docstring).

    Args:
        name: ``reward_model`` or ``judge``: the prefix of the columns it writes.
        scorer: requests to one score (or None) each.
        weight: the score's weight in the reward.
        normalize: z-score the scores over the batch's rows that did not fail.
        fallback_reward: the score of a failed row.
        max_rows_per_request: rows per scorer call.
        max_turns: the env's ``max_turns`` (None: a reply that called a tool always continues).
    """

    def __init__(
        self,
        name: str,
        scorer: Scorer,
        *,
        weight: float = 1.0,
        normalize: bool = False,
        fallback_reward: float = 0.0,
        max_rows_per_request: int = 64,
        max_turns: int | None = None,
        history_key: str = "history",
        answer_key: str = "answer",
    ) -> None:
        if name not in MODEL_REWARD_NAMES:
            raise ValueError(f"name must be one of {list(MODEL_REWARD_NAMES)}, got {name!r}")
        if max_rows_per_request < 1:
            raise ValueError(f"max_rows_per_request must be >= 1, got {max_rows_per_request}")
        self.name = name
        self.scorer = scorer
        self.weight = weight
        self.normalize = normalize
        self.fallback_reward = fallback_reward
        self.max_rows_per_request = max_rows_per_request
        self.max_turns = max_turns
        self.history_key = history_key
        self.answer_key = answer_key

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        final = self.final_rows(td).tolist()
        rows = [index for index, is_final in enumerate(final) if is_final]
        requests = requests_from_batch(td, self.history_key, self.answer_key)
        scores = self._scores([requests[index] for index in rows])
        batch = len(final)
        raw = torch.zeros(batch)
        failed = torch.zeros(batch, dtype=torch.bool)
        for index, score in zip(rows, scores, strict=True):
            failed[index] = score is None
            raw[index] = self.fallback_reward if score is None else score
        td.set(f"{self.name}_score", raw)
        td.set(f"{self.name}_failed", failed)
        scored = torch.zeros(batch, dtype=torch.bool)
        scored[rows] = True
        shaped = raw.clone()
        if self.normalize:
            kept = scored & ~failed
            shaped[kept] = _z_scores(raw[kept])
        td.set("reward", td.get("reward") + torch.where(scored, self.weight * shaped, 0.0))
        return td

    def final_rows(self, td: TensorDictBase) -> torch.Tensor:
        """bool ``[B]``: the rows whose episode ends with this reply (the env's rule: no tool
        call, or a reply cut off by the token limit, or no turns left)."""
        chats = td.get((self.history_key, "full")).to_chats()
        cut_off = torch.tensor([not bool(chat[-1].get("is_complete", True)) for chat in chats])
        batch = len(chats)
        tool_called = td.get("tool_called", torch.zeros(batch, dtype=torch.bool))
        final = ~tool_called.bool() | cut_off
        if self.max_turns is not None and ("next", "turn") in td.keys(True):
            final |= td.get(("next", "turn")) >= self.max_turns
        return final

    def _scores(self, requests: list[ScoreRequest]) -> list[float | None]:
        """One score (None: failed) per request, in requests of ``max_rows_per_request``."""
        scores: list[float | None] = []
        for start in range(0, len(requests), self.max_rows_per_request):
            chunk = requests[start : start + self.max_rows_per_request]
            try:
                got = list(self.scorer(chunk))
                if len(got) != len(chunk):
                    raise RuntimeError(f"{len(got)} scores for {len(chunk)} rows")
            except Exception as error:  # a model's fault is a counted failure, never a crash
                logger.warning(
                    "%s: %d rows get the fallback reward: %s", self.name, len(chunk), error
                )
                got = [None] * len(chunk)
            scores.extend(_finite(score) for score in got)
        return scores

    def __repr__(self) -> str:
        return f"ModelReward({self.name}, weight={self.weight:g})"


def _finite(score: float | None) -> float | None:
    """The score as a float, None when there is none or it is not finite."""
    try:
        value = float(score)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # None, or not a number at all
        return None
    return value if math.isfinite(value) else None


def _z_scores(values: torch.Tensor) -> torch.Tensor:
    """``(v - mean) / std`` with the population std; zeros when the values are all equal."""
    if values.numel() == 0:
        return values
    centred = values - values.mean()
    std = values.std(correction=0)
    return centred / std if std > 0 else torch.zeros_like(values)
