"""`PolicyVersion`: stamps the current policy version on every reset and step (and the state a
step leads to)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from llmrl.envs.transforms.base import EnvTransform


class PolicyVersion(EnvTransform):
    """Writes ``policy_version`` (long ``[B]``) into the data, so every sample says which
    weights produced it.

    Standalone, it keeps a version of its own (:meth:`increment` after each weight sync). In
    a collector it *follows* the collector's version (:meth:`follow`: the weight transport's,
    the one place a run keeps it) and keeps none: setting or incrementing it then raises.

    Example:
        version = PolicyVersion()
        env.append_transform(version)
        version.increment()
        # -> 1
    """

    def __init__(self, version: int = 0, key: str = "policy_version") -> None:
        self._version = version
        self._source: Callable[[], int] | None = None
        self.key = key

    @property
    def version(self) -> int:
        """The version stamped now (the followed source's, when following one)."""
        return self._source() if self._source is not None else self._version

    @version.setter
    def version(self, value: int) -> None:
        if self._source is not None:
            raise RuntimeError(
                "this PolicyVersion follows its collector's version (the weight transport's); "
                "set the version there"
            )
        self._version = int(value)

    def follow(self, source: Callable[[], int] | None) -> None:
        """Stamp ``source()`` from now on instead of a version of its own (None: keep one
        again, starting from the last one read)."""
        if source is None and self._source is not None:
            self._version = self._source()
        self._source = source

    def increment(self) -> int:
        """Advance to the next version and return it (not while following a source)."""
        self.version = self.version + 1
        return self.version

    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        td.set(self.key, torch.full(td.batch_size, self.version, dtype=torch.long))
        return td

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        """Stamps the transition and its next state (which a multi-turn episode continues from,
        like a reset state)."""
        version = torch.full(td.batch_size, self.version, dtype=torch.long)
        td.set(self.key, version)
        td.set(("next", self.key), version.clone())
        return td

    def __repr__(self) -> str:
        return f"PolicyVersion(version={self.version})"
