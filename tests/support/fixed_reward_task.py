"""A task whose reward signal is fixed per prompt, for the dynamic-sampling tests.

Kept apart from the test modules: env workers (Ray actors) import it to rebuild the task.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from llmrl.envs.tasks.base import Score


@dataclass(frozen=True)
class FixedRewardTask:
    """Prompts whose integer answer is a multiple of ``informative_every`` reward each response
    differently (a hash of its text: two different responses differ), the others give every
    response 0: whether a group carries a signal depends on its prompt only (``0``: none does).
    """

    informative_every: int = 3
    name: str = "fixed-reward"
    instructions: str = "Answer with a number."

    def informative(self, answer: str) -> bool:
        """Whether the prompt with this answer gets rewards that differ within its group."""
        return self.informative_every > 0 and int(answer) % self.informative_every == 0

    def score(self, response: str, problem_answer: str) -> Score:
        if not self.informative(problem_answer):
            return Score(reward=0.0, correct=False, formatted=False, parsed=None)
        reward = zlib.crc32(response.encode()) / 2**32
        return Score(reward=reward, correct=False, formatted=False, parsed=None)
