"""A state dict packed for Ray's object store: numpy arrays, each shared tensor once.

Ray pickles a torch tensor through torch's own ``torch.save`` path: the trainer copies every
tensor into a byte string and each reader parses it back into a fresh tensor (on the local
GRPO runtime with SmolLM2-135M, a visible share of the inference actor's time went to that
deserialisation: the profile of 2026-11-24 in docs/learning.md). Numpy arrays travel out of
band instead: ``ray.put`` writes them into shared memory once and ``ray.get`` hands back arrays
that point into it, so the reader's only copy is ``load_state_dict`` into its own parameters.

Tensors that share memory (a tied input embedding and output layer) are stored once and
restored under every name. Dtypes numpy lacks (``bfloat16``) travel as a same-width integer
view and are viewed back on unpacking.

Example:
    packed = PackedStateDict.pack(model.state_dict())
    ref = ray.put(packed)                          # in the trainer
    model.load_state_dict(ray.get(ref).unpack())   # in an inference actor
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

_VIEW_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtype of each element width: how a tensor numpy cannot hold travels."""


@dataclass(frozen=True)
class PackedStateDict:
    """A CPU state dict as numpy arrays (see the module docstring).

    Attributes:
        arrays: one array per distinct tensor, under the first name that held it.
        views: names stored as an integer view, with their torch dtype (``"bfloat16"``).
        aliases: every further name of a shared tensor, with the name it is stored under.
    """

    arrays: dict[str, np.ndarray]
    views: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def pack(cls, state: Mapping[str, torch.Tensor]) -> PackedStateDict:
        """Pack ``state`` (CPU tensors; others are moved to the CPU)."""
        arrays: dict[str, np.ndarray] = {}
        views: dict[str, str] = {}
        aliases: dict[str, str] = {}
        seen: dict[tuple, str] = {}
        for name, tensor in state.items():
            tensor = tensor.detach().cpu()
            key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
            if tensor.numel() and key in seen:
                aliases[name] = seen[key]
                continue
            seen[key] = name
            tensor = tensor.contiguous()
            try:
                arrays[name] = tensor.numpy()
            except TypeError:  # no numpy dtype (bfloat16, float8): an integer view
                arrays[name] = tensor.view(_VIEW_DTYPES[tensor.element_size()]).numpy()
                views[name] = str(tensor.dtype).removeprefix("torch.")
        return cls(arrays, views, aliases)

    def unpack(self) -> dict[str, torch.Tensor]:
        """The state dict: tensors over the arrays (no copy), shared ones under every name."""
        state: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():
            # arrays from the object store are read-only; load_state_dict only reads them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for name, array in self.arrays.items():
                tensor = torch.from_numpy(array)
                if name in self.views:
                    tensor = tensor.view(getattr(torch, self.views[name]))
                state[name] = tensor
        for name, target in self.aliases.items():
            state[name] = state[target]
        return state

    @property
    def nbytes(self) -> int:
        """Bytes stored (a shared tensor counts once)."""
        return sum(array.nbytes for array in self.arrays.values())
