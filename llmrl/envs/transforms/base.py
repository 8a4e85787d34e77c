"""`EnvTransform`: a step in the environment around the LLM (prompts, tools, rewards).

A transform sees the batch at reset and after every policy reply, in the order transforms were
appended to the env, and returns it (changed in place or replaced). Reading the result of the
previous transforms is allowed and expected (a reward after a tool call sees the tool's reply).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensordict import TensorDictBase


class EnvTransform:
    """Base class: override :meth:`on_reset`, :meth:`on_step` or both (default: no change).

    ``is_tool`` marks transforms that answer the assistant (e.g. a code interpreter): they set
    ``tool_called`` on the rows they answered, and those rows continue to another turn.
    """

    is_tool: bool = False

    def next_batch(self) -> TensorDictBase | None:
        """Prompts for ``ChatEnv.reset()`` called without a batch (see DataLoadingPrimer)."""
        return None

    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        """Called by ``ChatEnv.reset`` once the conversations are built."""
        return td

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        """Called by ``ChatEnv.step`` after the reply was appended to the conversation."""
        return td

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
