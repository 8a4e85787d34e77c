"""`RewardShaper`: the GRPO config's ``reward_shaping`` applied to each collected batch, before
its advantages (``docs/algorithms.md``, "Reward shaping").

Every option acts on the reply that ends a trajectory (its ``done`` row when the batch has
``traj_id`` and ``done``; every row of a single-turn batch), judged on that reply's response
tokens, length ``L``, with the budget ``L_max = generation.max_new_tokens``:

- ``overlong_buffer`` (DAPO's soft overlong punishment): ``L > L_max - L_buf`` adds
  ``-penalty * (L - (L_max - L_buf)) / L_buf`` (``-penalty`` at the budget), else 0;
- ``truncated``: a reply is *cut off* when it hit ``L_max`` before its end token (its
  message's ``is_complete`` is False, which the policy writes from the engine's ``finished``).
  The env's ``truncated`` column is not that: it also marks an episode out of turns, and with
  ``max_turns: 1`` a reply that called a tool. ``penalize`` adds ``-truncated_penalty``;
  ``mask`` clears the trajectory's ``loss_mask``;
- ``length_penalty`` (Kimi k1.5's length reward, times ``coeff``): over the final replies of a
  group, lengths ``min..max``, ``lambda = 0.5 - (L - min) / (max - min)`` (0 when
  ``max == min``); a correct reply adds ``coeff * lambda``, another ``coeff * min(0, lambda)``.
  Correct: the ``correct`` column (the task's verdict), else ``reward > 0``; a batch holds
  whole groups (a single-turn collector's always do);
- ``repetition``: the reply's n-gram repetition ratio ``1 - distinct / (L - n + 1)`` (0 when
  ``L < n``); over ``max_ratio`` the reward becomes ``reward`` (in place of every other
  shaping), or the trajectory's ``loss_mask`` is cleared.

The additive terms are computed from the env's reward and summed. A masked row keeps its
(shaped) reward: it still counts in its group's baseline, the trainer only leaves its tokens out
of the loss (:data:`~llmrl.objectives.token_level.LOSS_MASK_KEY`). With no mask option the batch
gets no ``loss_mask`` column; with one, every batch does (rounds concatenate).

Example:
    shaper = RewardShaper(RewardShapingSettings(truncated="mask"), max_new_tokens=64)
    rounds = ShapedRounds(collect, shaper)   # what DynamicSampler.sample calls
    sampled = sampler.sample(rounds)
    rounds.metrics()["shaping/truncated_rows"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from llmrl.data.non_tensor import as_list
from llmrl.objectives.token_level import LOSS_MASK_KEY

if TYPE_CHECKING:
    from llmrl.config.grpo import GRPOConfig
    from llmrl.config.reward_shaping import RewardShapingSettings


def overlong_penalty(
    lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment of responses of ``lengths`` tokens (``<= 0``; exactly 0
    up to ``max_new_tokens - buffer``, ``-penalty`` at the budget and beyond).

    Example:
        >>> overlong_penalty(torch.tensor([6.0, 7.0, 8.0, 10.0]), 10, 4, 1.0).tolist()
        [0.0, -0.25, -0.5, -1.0]
    """
    start = max_new_tokens - buffer
    over = (lengths.float() - start).clamp(min=0, max=buffer)
    return over * (-penalty / buffer) + 0.0  # + 0.0: no -0.0 where nothing is over


def length_reward(
    lengths: torch.Tensor, correct: torch.Tensor, groups: list[object]
) -> torch.Tensor:
    """Kimi k1.5's length reward of each response (see the module docstring), ``[-0.5, 0.5]``;
    ``groups`` holds each response's group id.

    Example:
        >>> length_reward(torch.tensor([2.0, 4.0, 6.0]), torch.tensor([True, True, False]),
        ...               [0, 0, 0]).tolist()
        [0.5, 0.0, -0.5]
    """
    out = torch.zeros(len(groups))
    lengths = lengths.float()
    for group in dict.fromkeys(groups):
        rows = torch.tensor([g == group for g in groups])
        low, high = lengths[rows].min(), lengths[rows].max()
        if high == low:
            continue
        lam = 0.5 - (lengths[rows] - low) / (high - low)
        out[rows] = torch.where(correct[rows], lam, lam.clamp(max=0))
    return out


def repetition_ratio(tokens: torch.Tensor, n: int) -> float:
    """``1 - distinct n-grams / n-grams`` of a response's ``tokens`` (0 when shorter than n).

    Example:
        >>> repetition_ratio(torch.tensor([1, 2, 1, 2, 1]), 2)   # 12 21 12 21: 2 distinct of 4
        0.5
    """
    if tokens.numel() < n:
        return 0.0
    grams = tokens.reshape(-1).unfold(0, n, 1)
    return 1.0 - torch.unique(grams, dim=0).shape[0] / grams.shape[0]


def cut_off_replies(batch: TensorDictBase) -> torch.Tensor:
    """bool ``[N]``: the replies that hit the token budget before their end token (their
    message's ``is_complete`` is False)."""
    history = batch.get(("history", "full"), None)
    if history is None:
        raise ValueError(
            "reward_shaping.truncated: tells cut-off replies by their message's is_complete, "
            "which a history-mode policy writes at ('history', 'full'); this batch has none"
        )
    return torch.tensor(
        [not bool(chat[-1].get("is_complete", True)) for chat in history.to_chats()]
    )


def final_rows(batch: TensorDictBase) -> torch.Tensor:
    """bool ``[N]``: the rows that end a trajectory (``done`` with ``traj_id``; else all)."""
    rows = batch.batch_size[0]
    done = batch.get("done", None)
    if done is None or batch.get("traj_id", None) is None:
        return torch.ones(rows, dtype=torch.bool)
    return done.reshape(-1).bool()


@dataclass
class ShapingCounts:
    """What shaping did to batches: rows each option touched, and the reward change."""

    rows: int = 0
    overlong_rows: int = 0
    truncated_rows: int = 0
    length_penalized_rows: int = 0
    repetition_rows: int = 0
    masked_rows: int = 0
    reward_delta_sum: float = 0.0

    def add(self, other: ShapingCounts) -> None:
        """Sum ``other``'s counts into these."""
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def metrics(self) -> dict[str, float]:
        """``shaping/<option>_rows``, ``shaping/masked_rows`` (rows out of the loss) and
        ``shaping/reward_delta_mean`` (mean of shaped - env reward over every row)."""
        names = [item.name for item in fields(self) if item.name.endswith("_rows")]
        out = {f"shaping/{name}": float(getattr(self, name)) for name in names}
        out["shaping/reward_delta_mean"] = self.reward_delta_sum / max(self.rows, 1)
        return out


class RewardShaper:
    """Shapes batches in place (see the module docstring).

    Args:
        settings: the config's ``reward_shaping``.
        max_new_tokens: the budget ``L_max`` (``generation.max_new_tokens``).
    """

    def __init__(self, settings: RewardShapingSettings, max_new_tokens: int) -> None:
        problems = settings.problems(max_new_tokens)
        if problems:
            raise ValueError("\n".join(problems))
        self.settings = settings
        self.max_new_tokens = max_new_tokens

    @classmethod
    def from_config(cls, config: GRPOConfig) -> RewardShaper | None:
        """The config's shaper; None when every option is off (batches untouched)."""
        settings = config.reward_shaping
        if not settings.enabled:
            return None
        return cls(settings, config.generation.max_new_tokens)

    def __call__(self, batch: TensorDictBase) -> ShapingCounts:
        """Shape ``batch``'s ``reward`` (and set its ``loss_mask``); what was done."""
        settings = self.settings
        reward = batch.get("reward")
        raw = reward.reshape(-1)
        raw = raw if raw.is_floating_point() else raw.float()
        final = final_rows(batch)
        responses = batch.get("tokens").as_list("response")
        lengths = torch.tensor([len(r) for r in responses], dtype=torch.float)
        counts = ShapingCounts(rows=raw.numel())
        delta = torch.zeros_like(raw)
        masked = torch.zeros_like(final)
        if settings.overlong_buffer is not None:
            buffer = settings.overlong_buffer
            term = overlong_penalty(lengths, self.max_new_tokens, buffer.length, buffer.penalty)
            delta += torch.where(final, term, 0.0)
            counts.overlong_rows = int((final & (term != 0)).sum())
        if settings.truncated != "keep":
            cut = final & cut_off_replies(batch)
            counts.truncated_rows = int(cut.sum())
            if settings.truncated == "penalize":
                assert settings.truncated_penalty is not None
                delta -= settings.truncated_penalty * cut.float()
            else:
                masked |= cut
        if settings.length_penalty is not None:
            term = settings.length_penalty.coeff * self._length_reward(batch, raw, lengths, final)
            delta += term
            counts.length_penalized_rows = int((term != 0).sum())
        shaped = raw + delta
        if settings.repetition is not None:
            filtered = settings.repetition
            ratios = torch.tensor([repetition_ratio(r, filtered.ngram) for r in responses])
            hit = final & (ratios > filtered.max_ratio)
            counts.repetition_rows = int(hit.sum())
            if filtered.action == "mask":
                masked |= hit
            else:
                shaped = torch.where(hit, shaped.new_tensor(float(filtered.reward)), shaped)
        counts.reward_delta_sum = float((shaped - raw).sum())
        batch.set("reward", shaped.to(reward.dtype).reshape(reward.shape))
        if settings.masks:
            kept = ~_trajectories_of(batch, masked)
            counts.masked_rows = int((~kept).sum())
            batch.set(LOSS_MASK_KEY, kept)
        return counts

    def _length_reward(
        self, batch: TensorDictBase, raw: torch.Tensor, lengths: torch.Tensor, final: torch.Tensor
    ) -> torch.Tensor:
        """Kimi's length reward of the final rows (0 on the others), grouped by ``group_id``."""
        correct = batch.get("correct", None)
        correct = raw > 0 if correct is None else correct.reshape(-1).bool()
        groups = as_list(batch.get("group_id").reshape(-1))
        rows = final.nonzero().reshape(-1)
        out = torch.zeros_like(raw)
        picked = [groups[row] for row in rows.tolist()]
        out[rows] = length_reward(lengths[rows], correct[rows], picked)
        return out


def _trajectories_of(batch: TensorDictBase, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` widened to every row of their trajectories (``traj_id``; else the rows)."""
    traj = batch.get("traj_id", None)
    if traj is None or not rows.any():
        return rows
    ids = as_list(traj.reshape(-1))
    hit = {ids[row] for row in rows.nonzero().reshape(-1).tolist()}
    return torch.tensor([i in hit for i in ids], dtype=torch.bool)


class ShapedRounds:
    """``collect`` with each round's batch shaped before the advantage sees it (the callable
    :meth:`~llmrl.collectors.DynamicSampler.sample` takes), and the step's shaping metrics.

    Args:
        collect: the composition's ``collect(round_index)``.
        shaper: the step's shaper; None: batches pass as they are and there are no metrics.
    """

    def __init__(
        self, collect: Callable[[int], TensorDictBase], shaper: RewardShaper | None
    ) -> None:
        self.collect = collect
        self.shaper = shaper
        self.counts = ShapingCounts()

    def __call__(self, round_index: int) -> TensorDictBase:
        """Round ``round_index``'s batch, shaped."""
        batch = self.collect(round_index)
        if self.shaper is not None:
            self.counts.add(self.shaper(batch))
        return batch

    def metrics(self) -> dict[str, float]:
        """``shaping/*`` summed over the rounds so far (nothing without a shaper)."""
        return {} if self.shaper is None else self.counts.metrics()
