"""`ReplayBuffer`: a store of ragged transitions that trainers sample mini-batches from.

Rows are stored one by one, as single-row tensordicts (``td[i]`` of what was given to
:meth:`ReplayBuffer.extend`), by reference: nothing is copied or padded, so rows of different
lengths (ragged :class:`~llmrl.data.Tokens`, histories of different turns) live side by side. A
sampled batch is ``lazy_stack(rows)``: ragged containers stay ragged and read back unchanged
(``batch["tokens"].as_list("response")``).

Sampling:

- ``"without_replacement"`` (default): epochs over the stored rows, each in a new shuffled order
  reproducible from ``seed``. Every row comes out exactly once per epoch; the last batch of an
  epoch may be smaller than asked. An epoch covers the rows stored when it started: rows added
  meanwhile wait for the next epoch, rows dropped meanwhile (``capacity``) are skipped.
- ``"with_replacement"``: rows drawn uniformly at random, independently.

``capacity`` keeps only the newest rows (FIFO). A write ``transform`` runs on every batch given
to :meth:`extend` before it is stored; it may return ``None`` to store nothing yet (an
advantage transform waiting until every sample of a group has arrived).

Example:
    buffer = ReplayBuffer(batch_size=16, seed=0)
    buffer.extend(batch)                  # a [N] tensordict from a collector
    for minibatch in buffer:              # one epoch, in batches of 16
        loss = loss_fn(minibatch)
    buffer.sample(8)["reward"].shape
    # -> torch.Size([8])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from tensordict import TensorDictBase, lazy_stack

Sampler = Literal["without_replacement", "with_replacement"]
WriteTransform = Callable[[TensorDictBase], "TensorDictBase | None"]

SAMPLERS: tuple[str, ...] = ("without_replacement", "with_replacement")


class EmptyBufferError(RuntimeError):
    """Sampling from a :class:`ReplayBuffer` that holds no rows."""


class ReplayBuffer:
    """A FIFO store of single-row tensordicts with epoch or uniform sampling (see module doc).

    Args:
        capacity: most rows kept; older rows are dropped first. ``None``: unbounded.
        sampler: ``"without_replacement"`` (shuffled epochs) or ``"with_replacement"``.
        transform: called on each batch given to :meth:`extend`; returns the rows to store,
            or ``None`` to store nothing.
        seed: seed of the sampling order (the same seed and writes give the same batches).
        batch_size: default batch size of :meth:`sample` and of iteration.
    """

    def __init__(
        self,
        capacity: int | None = None,
        sampler: Sampler = "without_replacement",
        transform: WriteTransform | None = None,
        seed: int = 0,
        batch_size: int | None = None,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {capacity}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.capacity = capacity
        self.sampler = sampler
        self.transform = transform
        self.seed = seed
        self.batch_size = batch_size
        self._rows: deque[TensorDictBase] = deque()
        self._first_id = 0  # id of self._rows[0]; ids grow by one per stored row
        self._generator = torch.Generator().manual_seed(seed)
        self._epoch: list[int] = []  # ids still to visit in the current epoch, in order
        self.epochs = 0  # epochs started by the without-replacement sampler

    # ------------------------------------------------------------------ writing
    def extend(self, td: TensorDictBase) -> int:
        """Store the rows of ``td`` (``[N]``, or one row ``[]``) after the write transform.

        Returns the number of rows stored (0 when the transform returned ``None``).
        """
        if self.transform is not None:
            td = self.transform(td)
            if td is None:
                return 0
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"extend takes a TensorDict, got {type(td).__name__}")
        if td.batch_dims == 0:
            rows = [td]
        elif td.batch_dims == 1:
            rows = [td[i] for i in range(td.batch_size[0])]
        else:
            raise ValueError(f"extend takes a batch [N] or a row []; got {list(td.batch_size)}")
        self._rows.extend(rows)
        if self.capacity is not None:
            while len(self._rows) > self.capacity:
                self._rows.popleft()
                self._first_id += 1
        return len(rows)

    def empty(self) -> None:
        """Drop every row and start a new epoch on the next sample (the RNG goes on)."""
        self._first_id += len(self._rows)
        self._rows.clear()
        self._epoch = []

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._rows)

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """A batch ``[n]`` of stored rows, ``lazy_stack``-ed (see the module docstring).

        Raises:
            EmptyBufferError: the buffer holds no rows.
        """
        size = self._batch_size(batch_size)
        if not self._rows:
            raise EmptyBufferError(
                "the replay buffer is empty: extend it (e.g. run the collector) before sampling"
            )
        if self.sampler == "with_replacement":
            picks = torch.randint(len(self._rows), (size,), generator=self._generator).tolist()
            return lazy_stack([self._rows[i] for i in picks])
        return lazy_stack([self._rows[i - self._first_id] for i in self._next_ids(size)])

    def iter_batches(self, batch_size: int | None = None) -> Iterator[TensorDictBase]:
        """One pass over the stored rows in batches of ``batch_size``.

        Without replacement this is an epoch of its own (the epoch :meth:`sample` is in is left
        as it is): every row once, the last batch possibly smaller. With replacement it is
        ``ceil(len / batch_size)`` batches drawn at random.
        """
        size = self._batch_size(batch_size)
        if not self._rows:
            return
        if self.sampler == "with_replacement":
            for _ in range(-(-len(self._rows) // size)):
                yield self.sample(size)
            return
        order = self._new_epoch()
        for start in range(0, len(order), size):
            ids = [i for i in order[start : start + size] if i >= self._first_id]
            if ids:
                yield lazy_stack([self._rows[i - self._first_id] for i in ids])

    def __iter__(self) -> Iterator[TensorDictBase]:
        return self.iter_batches()

    def __repr__(self) -> str:
        return f"ReplayBuffer(rows={len(self)}, capacity={self.capacity}, sampler={self.sampler!r})"

    # ------------------------------------------------------------------ internals
    def _batch_size(self, batch_size: int | None) -> int:
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise ValueError("no batch size: pass one, or set batch_size= on the ReplayBuffer")
        if size < 1:
            raise ValueError(f"batch_size must be >= 1, got {size}")
        return size

    def _next_ids(self, size: int) -> list[int]:
        """The next ``size`` ids of the current epoch (fewer at its end), starting a new epoch
        when the current one is used up; ids dropped since the epoch began are skipped."""
        self._epoch = [i for i in self._epoch if i >= self._first_id]
        if not self._epoch:
            self._epoch = self._new_epoch()
        picked, self._epoch = self._epoch[:size], self._epoch[size:]
        return picked

    def _new_epoch(self) -> list[int]:
        """The ids of every stored row in a new shuffled order."""
        self.epochs += 1
        order = torch.randperm(len(self._rows), generator=self._generator)
        return (order + self._first_id).tolist()
