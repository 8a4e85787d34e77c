"""`PolicyVersion`: stamps the current policy version on every reset and step (and the state a
step leads to)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from llmrl.envs.transforms.base import EnvTransform


class PolicyVersion(EnvTransform):
    """Writes ``policy_version`` (long ``[B]``) into the data; the weight updater calls
    :meth:`increment` after each weight sync, so every sample says which weights produced it.

    Example:
        >>> version = PolicyVersion()
        >>> env.append_transform(version)
        >>> version.increment()
        1
    """

    def __init__(self, version: int = 0, key: str = "policy_version") -> None:
        self.version = version
        self.key = key

    def increment(self) -> int:
        """Advance to the next version and return it."""
        self.version += 1
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
