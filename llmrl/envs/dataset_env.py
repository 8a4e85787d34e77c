"""`DatasetChatEnv`: a `ChatEnv` whose prompts come from a dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrl.envs.chat_env import ChatEnv
from llmrl.envs.transforms.base import EnvTransform
from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer


class DatasetChatEnv(ChatEnv):
    """``reset()`` draws the next batch of rows (each repeated ``repeats`` times for GRPO
    groups, see :class:`DataLoadingPrimer`); the rest is :class:`ChatEnv`.

    Example:
        env = DatasetChatEnv(problems, batch_size=4, repeats=8, system_prompt="...")
        td = env.reset()            # 32 rows: 4 prompts x 8
        td = env.step(policy(td))
    """

    def __init__(
        self,
        rows: Sequence[Any],
        batch_size: int,
        repeats: int = 1,
        system_prompt: str | None = None,
        max_turns: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        epochs: int | None = None,
        transforms: list[EnvTransform] | None = None,
        group_ids: tuple[int, int] = (0, 1),
    ) -> None:
        """``group_ids``: ``(start, step)`` of the group ids drawn (see
        :class:`DataLoadingPrimer`); env workers ``i`` of ``n`` pass ``(i, n)``."""
        self.primer = DataLoadingPrimer(
            rows, batch_size, repeats, shuffle, seed, epochs, *group_ids
        )
        super().__init__(system_prompt, max_turns, [self.primer, *(transforms or [])])
