"""`LLMCollector`: runs a policy in a chat env and yields batches of finished trajectories.

The loop (one env, one policy, in this process):

1. ``state = env.reset()`` draws a batch of prompts; each row starts a trajectory with its own
   ``traj_id`` (and ``turn`` 0, written by the env).
2. ``transition = env.step(policy(state))``: one *dialog turn* (one policy reply) per row.
3. Rows that are not ``done`` continue: ``state = transition["next"][not_done]``. When every
   row is done, the env is reset again.

Each transition row is kept in its trajectory; when a trajectory ends, all its transitions (in
turn order) become ready. A batch (a ``lazy_stack`` ``[n]`` of transition rows, ragged
containers intact) is yielded as soon as at least ``dialog_turns_per_batch`` transitions are
ready: whole trajectories in the order they finished, the fewest that reach that count (the
others wait for the next batch), so trajectories are never split across batches. With
``yield_completed_trajectories=False`` transitions are yielded as they are produced instead, in
batches of exactly ``dialog_turns_per_batch`` (a trajectory may then span batches).

Collection stops once ``total_dialog_turns`` transitions were yielded (batches are whole, so
the last one may overshoot), or when the env's dataset is exhausted (what is left comes as a
last, smaller batch). With a ``replay_buffer`` batches are written to it and iteration yields
the number of rows it stored.

Every row carries ``traj_id``, ``turn`` and ``policy_version``: the version of the weights
that produced *that reply* (0 at first, +1 on each :meth:`LLMCollector.update_policy_weights_`),
so a trajectory in flight during an update, or rows that waited for the next batch, carry the
older version. The version is the weight transport's (``weight_updater.version``): the
collector reads it from there, and an env's :class:`~llmrl.envs.PolicyVersion` transform
follows it. Finished trajectories pass through the rollout transport's contract
(:mod:`llmrl.transports.rollouts`, in process), which refuses a sample without its version.

Example:
    env = ArithmeticEnv(batch_size=4, repeats=8)
    collector = LLMCollector(env, policy, dialog_turns_per_batch=64, total_dialog_turns=6400)
    for batch in collector:            # [>= 64] transitions of finished trajectories
        train_on(batch)
        collector.update_policy_weights_()
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase, lazy_stack

from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer
from llmrl.envs.transforms.policy_version import PolicyVersion
from llmrl.transports.rollouts import RolloutBatch, in_process_rollouts
from llmrl.transports.weights import VersionOnlyUpdater, WeightSyncStats, WeightUpdater

if TYPE_CHECKING:
    from llmrl.data.replay import ReplayBuffer
    from llmrl.envs.chat_env import ChatEnv

logger = logging.getLogger(__name__)

Trajectory = list[TensorDictBase]
"""The transition rows (``[]`` tensordicts) of one trajectory, in turn order."""


@dataclass
class StepResult:
    """What one env step produced: its transition rows, and the trajectories it finished."""

    transitions: list[TensorDictBase] = field(default_factory=list)
    finished: list[Trajectory] = field(default_factory=list)

    def units(self, by_trajectory: bool) -> list[Trajectory]:
        """What a :class:`BatchAssembler` takes: the finished trajectories, or each transition
        on its own."""
        return self.finished if by_trajectory else [[row] for row in self.transitions]


class TrajectoryRunner:
    """Steps one env with one policy, row by row, and returns finished trajectories.

    ``policy`` is any callable from a state ``[B]`` to the policy's output ``[B]`` (a policy, or
    a remote call to one). Trajectory ids are ``traj_id_start``, ``+ traj_id_step``, ...: give
    each of N workers ``start=i, step=N`` and ids never collide. ``env.reset()`` raising
    ``StopIteration`` (a dataset with a fixed number of epochs) sets :attr:`exhausted`.

    Example:
        runner = TrajectoryRunner(env, policy)
        result = runner.step()
        [len(trajectory) for trajectory in result.finished]
    """

    def __init__(
        self,
        env: ChatEnv,
        policy: Callable[[TensorDictBase], TensorDictBase],
        traj_id_start: int = 0,
        traj_id_step: int = 1,
        keep_trajectories: bool = True,
    ) -> None:
        self.env = env
        self.policy = policy
        self.next_traj_id = traj_id_start
        self.traj_id_step = traj_id_step
        self.keep_trajectories = keep_trajectories
        self.exhausted = False
        self.state: TensorDictBase | None = None
        self._partial: dict[int, Trajectory] = {}

    @property
    def in_flight(self) -> int:
        """Rows whose trajectory goes on at the next step."""
        return 0 if self.state is None else self.state.batch_size[0]

    def reset(self) -> None:
        """Drop the trajectories in progress (the next step resets the env)."""
        self.state, self._partial = None, {}

    def state_dict(self) -> dict[str, Any]:
        """The next trajectory id and the env primer's position (not the rows in progress)."""
        primer = find_primer(self.env)
        return {
            "next_traj_id": self.next_traj_id,
            "primer": None if primer is None else primer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; trajectories in progress are dropped."""
        self.reset()
        self.exhausted = False
        self.next_traj_id = int(state["next_traj_id"])
        primer = find_primer(self.env)
        if primer is not None and state.get("primer") is not None:
            primer.load_state_dict(state["primer"])

    def step(self, rows_wanted: int | None = None) -> StepResult:
        """One policy reply for every row in progress (resetting the env first if none is).
        ``rows_wanted``: how many finished rows the caller still needs (a runner that can
        return early uses it; this one replies to every row)."""
        if self.state is None:
            self.state = None if self.exhausted else self._reset_env()
            if self.state is None:
                return StepResult()
        state = self.state
        out = self.policy(state)
        if out.batch_dims != 1 or out.batch_size[0] != state.batch_size[0]:
            raise ValueError(
                f"the policy turned a state {list(state.batch_size)} into "
                f"{list(out.batch_size)}; collectors need one reply per row (num_samples=1: "
                "make GRPO groups with the env's `repeats` instead)"
            )
        transition = self.env.step(out)
        done = transition.get("done").reshape(-1).tolist()
        ids = transition.get("traj_id").tolist()
        result = StepResult()
        for index, (traj, row_done) in enumerate(zip(ids, done, strict=True)):
            row = transition[index]
            result.transitions.append(row)
            if not self.keep_trajectories:
                continue
            self._partial.setdefault(traj, []).append(row)
            if row_done:
                result.finished.append(self._partial.pop(traj))
        going_on = [index for index, row_done in enumerate(done) if not row_done]
        self.state = transition.get("next")[torch.tensor(going_on)] if going_on else None
        return result

    def _reset_env(self) -> TensorDictBase | None:
        """A fresh batch of prompts with their trajectory ids; None (and :attr:`exhausted`
        set) when the env's dataset ran out."""
        try:
            state = self.env.reset()
        except (StopIteration, RuntimeError) as error:
            # A primer's StopIteration reaches us as is, or (raised inside a generator, as
            # ChatEnv.reset looks for prompts) as RuntimeError caused by it (PEP 479).
            if not isinstance(error, StopIteration) and not isinstance(
                error.__cause__, StopIteration
            ):
                raise
            self.exhausted = True
            return None
        count = state.batch_size[0]
        ids = self.next_traj_id + self.traj_id_step * torch.arange(count)
        self.next_traj_id += self.traj_id_step * count
        state.set("traj_id", ids)
        return state


class BatchAssembler:
    """Groups units (whole trajectories, or single transitions) into batches of at least
    ``turns_per_batch`` transitions, taking the fewest units, first in first out."""

    def __init__(self, turns_per_batch: int) -> None:
        if turns_per_batch < 1:
            raise ValueError(f"dialog_turns_per_batch must be >= 1, got {turns_per_batch}")
        self.turns_per_batch = turns_per_batch
        self._units: deque[Trajectory] = deque()
        self.pending_turns = 0

    def add(self, units: list[Trajectory]) -> None:
        """Queue units (each a non-empty list of transition rows)."""
        for unit in units:
            self._units.append(unit)
            self.pending_turns += len(unit)

    def pop(self, flush: bool = False) -> list[TensorDictBase] | None:
        """The rows of the next batch, or None when too few are pending (``flush``: take what
        is pending, if anything)."""
        if not self.pending_turns or (self.pending_turns < self.turns_per_batch and not flush):
            return None
        rows: list[TensorDictBase] = []
        while self._units and len(rows) < self.turns_per_batch:
            rows.extend(self._units.popleft())
        self.pending_turns -= len(rows)
        return rows


class CollectorBase(ABC):
    """What every collector shares: batching, counters, versions and iteration.

    Subclasses produce transitions in :meth:`_collect_more` (adding units with
    :meth:`_record`) and say in :meth:`_exhausted` when no more will come.
    """

    def __init__(
        self,
        dialog_turns_per_batch: int,
        total_dialog_turns: int = -1,
        replay_buffer: ReplayBuffer | None = None,
        weight_updater: WeightUpdater | None = None,
        yield_completed_trajectories: bool = True,
    ) -> None:
        if total_dialog_turns == 0 or total_dialog_turns < -1:
            raise ValueError(f"total_dialog_turns must be > 0 or -1, got {total_dialog_turns}")
        self.dialog_turns_per_batch = dialog_turns_per_batch
        self.total_dialog_turns = total_dialog_turns
        self.replay_buffer = replay_buffer
        self._weight_updater: WeightUpdater = (
            VersionOnlyUpdater() if weight_updater is None else weight_updater
        )
        self.yield_completed_trajectories = yield_completed_trajectories
        self._assembler = BatchAssembler(dialog_turns_per_batch)
        self.stats = {"turns": 0, "trajectories": 0, "batches": 0, "yielded_turns": 0}

    # ------------------------------------------------------------------ versions
    @property
    def weight_updater(self) -> WeightUpdater:
        """The weight transport (a :class:`~llmrl.transports.VersionOnlyUpdater` when none was
        given). Its ``version`` is the policy version; a replacement continues from it."""
        return self._weight_updater

    @weight_updater.setter
    def weight_updater(self, updater: WeightUpdater) -> None:
        updater.version = self.policy_version
        self._weight_updater = updater

    @property
    def policy_version(self) -> int:
        """Version of the policy's current weights: 0, then +1 per weight update. Read from
        the weight transport, which keeps it (the collector keeps no count of its own)."""
        return self._weight_updater.version

    def _set_version(self, version: int) -> None:
        self._weight_updater.version = int(version)

    def update_policy_weights_(self, weights: Any = None) -> WeightSyncStats:
        """Push ``weights`` (a model or a state dict; None: the updater's own source) through
        the weight updater as the next version, which the updater then holds.

        Without a weight updater only the version advances (the policy shares the trainer's
        model). Returns the push's :class:`~llmrl.transports.WeightSyncStats`.
        """
        stats = self._weight_updater.push(weights, version=self.policy_version + 1)
        logger.debug("policy weights updated to version %d", stats.version)
        return stats

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[TensorDictBase | int]:
        """Batches ``[n]`` of transitions (or, with a replay buffer, the rows it stored).

        Collection state (trajectories in progress, pending ones) survives a ``break``: the
        next iteration goes on from there.
        """
        while not self.finished:
            rows = self._assembler.pop(flush=self._exhausted())
            if rows is not None:
                yield self._emit(rows)
            elif self._exhausted():
                return
            else:
                self._collect_more()

    @property
    def finished(self) -> bool:
        """Whether ``total_dialog_turns`` transitions were yielded."""
        total = self.total_dialog_turns
        return total >= 0 and self.stats["yielded_turns"] >= total

    def metrics(self) -> dict[str, float]:
        """``stats`` as tracker metrics, ``collector/<name>`` (a Ray collector's include
        ``collector/env_worker_restarts`` and ``collector/inference_actor_restarts``)."""
        return {f"collector/{name}": float(value) for name, value in self.stats.items()}

    @abstractmethod
    def _collect_more(self) -> None:
        """Produce more transitions (recording finished trajectories)."""

    @abstractmethod
    def _exhausted(self) -> bool:
        """True when no more transitions will come (e.g. the dataset ran out)."""

    def _drop_pending(self) -> None:
        """Forget transitions waiting for a batch (after loading a checkpoint)."""
        self._assembler = BatchAssembler(self.dialog_turns_per_batch)

    def _record(self, units: list[Trajectory], turns: int, trajectories: int) -> None:
        self.stats["turns"] += turns
        self.stats["trajectories"] += trajectories
        self._assembler.add(units)

    def _emit(self, rows: list[TensorDictBase]) -> TensorDictBase | int:
        batch = lazy_stack(rows)
        self.stats["batches"] += 1
        self.stats["yielded_turns"] += len(rows)
        logger.debug(
            "batch %d: %d transitions (%d yielded, %d generated, %d trajectories finished)",
            self.stats["batches"],
            len(rows),
            self.stats["yielded_turns"],
            self.stats["turns"],
            self.stats["trajectories"],
        )
        if self.replay_buffer is not None:
            return self.replay_buffer.extend(batch)
        return batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dialog_turns_per_batch={self.dialog_turns_per_batch}, "
            f"total_dialog_turns={self.total_dialog_turns}, version={self.policy_version})"
        )


class LLMCollector(CollectorBase):
    """Collects transitions of ``policy`` in ``env`` (see the module docstring).

    Args:
        env: a :class:`~llmrl.envs.ChatEnv` whose ``reset()`` draws prompts by itself (a
            ``DatasetChatEnv`` / task env, or any env with a ``DataLoadingPrimer``).
        policy: a history-mode policy replying once per row (``num_samples=1``).
        dialog_turns_per_batch: transitions (policy replies) per yielded batch, at least.
        total_dialog_turns: stop once this many transitions were yielded; -1: never stop.
        replay_buffer: when given, batches are written to it (``extend``) and iteration yields
            the number of rows the buffer stored instead of the batch.
        weight_updater: called by :meth:`update_policy_weights_` to push new weights; its
            ``version`` is the collector's (and the env's PolicyVersion follows it).
        yield_completed_trajectories: True (default): batches of whole finished trajectories;
            False: transitions as they come, exactly ``dialog_turns_per_batch`` a batch.

    ``stats`` counts ``turns`` (replies generated), ``trajectories`` (finished), ``batches``
    and ``yielded_turns`` (transitions yielded, or written to the replay buffer); each batch is
    also logged at DEBUG level on the ``llmrl.collectors.llm_collector`` logger.
    """

    def __init__(
        self,
        env: ChatEnv,
        policy: Callable[[TensorDictBase], TensorDictBase],
        dialog_turns_per_batch: int,
        total_dialog_turns: int = -1,
        replay_buffer: ReplayBuffer | None = None,
        weight_updater: WeightUpdater | None = None,
        yield_completed_trajectories: bool = True,
    ) -> None:
        super().__init__(
            dialog_turns_per_batch,
            total_dialog_turns,
            replay_buffer,
            weight_updater,
            yield_completed_trajectories,
        )
        self.env = env
        self.policy = policy
        self._version = find_version_transform(env)
        self.version_key = self._version.key if self._version is not None else "policy_version"
        if self._version is not None:  # the env stamps the weight transport's version
            if self._version.version and not self.policy_version:
                self._set_version(self._version.version)  # an env that starts further on
            self._version.follow(lambda: self.policy_version)
        self._runner = TrajectoryRunner(
            env, self._call_policy, keep_trajectories=yield_completed_trajectories
        )
        self._rollout_sender, self._rollout_receiver = in_process_rollouts(self.version_key)

    def _collect_more(self) -> None:
        result = self._runner.step()
        units = result.units(self.yield_completed_trajectories)
        # through the rollout transport's contract: every sample must carry its version
        self._rollout_sender.send(RolloutBatch(units))
        (batch,) = self._rollout_receiver.receive_ready()
        self._record(batch.trajectories, len(result.transitions), len(result.finished))

    def _exhausted(self) -> bool:
        return self._runner.exhausted and not self._runner.in_flight

    def _call_policy(self, state: TensorDictBase) -> TensorDictBase:
        version = torch.full(state.batch_size, self.policy_version, dtype=torch.long)
        state.set(self.version_key, version)
        return self.policy(state)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Counters, policy version, next trajectory id and the env primer's position.

        Trajectories in progress are not saved: after :meth:`load_state_dict` collection
        starts from a fresh ``env.reset()`` (their prompts are skipped, not replayed).
        """
        return {
            "stats": dict(self.stats),
            "policy_version": self.policy_version,
            **self._runner.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (drops trajectories in progress and pending batches)."""
        self.stats = dict(state["stats"])
        self._set_version(int(state["policy_version"]))
        self._runner.load_state_dict(state)
        self._drop_pending()


def find_primer(env: Any) -> DataLoadingPrimer | None:
    """The env's :class:`DataLoadingPrimer` (its dataset position), if it has one."""
    primer = getattr(env, "primer", None)
    if isinstance(primer, DataLoadingPrimer):
        return primer
    transforms = getattr(env, "transforms", [])
    return next((t for t in transforms if isinstance(t, DataLoadingPrimer)), None)


def find_version_transform(env: Any) -> PolicyVersion | None:
    """The env's :class:`PolicyVersion` transform, if it has one."""
    transforms = getattr(env, "transforms", [])
    return next((t for t in transforms if isinstance(t, PolicyVersion)), None)
