"""`TrainerGroup`: the driver's handle on the trainer ranks (Ray actors).

It starts one :class:`~llmrl.runtime.trainer_rank.TrainerRank` per rank on the trainer's
placement bundles, has them meet (rank 0 publishes an address and port, every rank joins the
process group), and then calls each method on every rank at once: :meth:`train` (each rank gets
whole groups of the batch), :meth:`push_weights`, :meth:`save`.

**A dead rank ends the stage.** The other ranks would wait in a collective until its timeout,
so every call waits on all ranks together; the first rank whose process died (killed, out of
memory) makes the group kill the others and raise :class:`TrainerRankDied` naming it. The
stage exits non-zero and a re-run resumes from the last checkpoint. A weight push or an engine
restore that outlives its deadline (``runtime.timeouts.weight_push_s``, plus
``runtime.collective_timeout_s`` for the gather before it) ends the same way, with a
:class:`~llmrl.core.deadlines.CallTimeout` naming the rank; rank 0's own deadline on the engines
is shorter, so an engine that hangs is named by rank 0 first (and the ranks stay up).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from tensordict import TensorDictBase

from llmrl.collectors.actor_faults import first_line, is_actor_death
from llmrl.config.grpo import GRPOConfig
from llmrl.core.deadlines import CallTimeout, Deadline, Hung
from llmrl.objectives.grouping import group_slices
from llmrl.runtime.trainer_rank import TrainerRank
from llmrl.topology import Placement, Topology
from llmrl.train.micro_batches import balanced_assignment, sequence_lengths, take
from llmrl.transports.weights import WeightSyncStats

logger = logging.getLogger(__name__)


class TrainerRankDied(RuntimeError):
    """A trainer rank's process died; the message names the rank and the call."""


class TrainerGroup:
    """The trainer ranks of ``topology`` on ``placement`` (see the module docstring).

    Args:
        config: the stage config.
        topology: the run's topology (world size, strategy, reference placement).
        placement: the reserved placement groups.
        resume_from: a checkpoint directory every rank loads weights and optimizer from.
        runtime_env: Ray runtime environment of the rank actors.
    """

    def __init__(
        self,
        *,
        config: GRPOConfig,
        topology: Topology,
        placement: Placement,
        resume_from: str | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        spec = placement.specs.trainer
        self.world_size = spec.count
        self.num_samples = config.num_samples
        self.balance_tokens = config.max_tokens_per_micro_batch is not None
        runtime = config.runtime
        self.push_timeout_s = runtime.timeouts.weight_push_s + runtime.collective_timeout_s
        """The driver's bound on a push: the ranks' gather, then rank 0's push."""
        self.minibatches = config.minibatches
        self.ranks = self._start_ranks(config, topology, placement, runtime_env)
        address, port = self._all("rendezvous", ranks=[0])[0]
        self._all("setup", address, port, resume_from, stop_on_error=True)
        logger.info(
            "%d trainer rank(s) ready (%s, %s)",
            self.world_size,
            spec.strategy,
            "resumed from " + resume_from if resume_from else "fresh",
        )

    def _start_ranks(
        self,
        config: GRPOConfig,
        topology: Topology,
        placement: Placement,
        runtime_env: dict[str, Any] | None,
    ) -> list[Any]:
        """One :class:`TrainerRank` actor per rank, on that rank's bundle with the resources
        of the placement's :class:`~llmrl.topology.roles.TrainerRole`."""
        import ray

        spec = placement.specs.trainer
        total_steps = config.total_optimizer_steps
        with_reference = config.reference and topology.reference.placement == "with_trainer"
        actor = ray.remote(TrainerRank)
        ranks = []
        for rank in range(self.world_size):
            options = spec.actor_options(placement.trainer.scheduling_strategy(rank))
            options["max_concurrency"] = 1
            if runtime_env:
                options["runtime_env"] = runtime_env
            handle = actor.options(**options).remote(
                config=config,
                rank=rank,
                world_size=self.world_size,
                strategy=spec.strategy,
                total_optimizer_steps=total_steps,
                reference_with_trainer=with_reference,
                threads=config.runtime.torch_threads,
            )
            ranks.append(handle)
        return ranks

    def connect_engines(
        self,
        inference_actors: list[Any],
        vllm_engines: list[Any],
        ranks_per_engine: int,
        transport: str = "auto",
        colocated: bool = False,
    ) -> None:
        """Give the ranks the engines rank 0 pushes weights to, over ``transport``
        (``topology.weight_transport``; the other ranks take part in ``ipc`` pushes)."""
        self._all(
            "connect_engines",
            inference_actors,
            vllm_engines,
            ranks_per_engine,
            transport,
            colocated,
        )

    def train(self, batch: TensorDictBase, step: int) -> dict[str, float]:
        """Train every rank on its groups of ``batch`` (advantages set); rank 0's metrics,
        which are global (see :mod:`llmrl.train.grpo_trainer`)."""
        shards = split_groups(batch, self.num_samples, self.world_size, self.balance_tokens)
        calls = [
            ("train", (shard, self.minibatches, step, stand_in), rank)
            for rank, (shard, stand_in) in enumerate(shards)
        ]
        refs = [getattr(self.ranks[r], m).remote(*a) for m, a, r in calls]
        return self._wait(refs, "train", stop_on_error=True)[0]

    def push_weights(self, version: int) -> WeightSyncStats:
        """Every rank takes part (FSDP gathers the weights), rank 0 sends them; its stats."""
        return self._all("push_weights", version, deadline=(self.push_timeout_s, version))[0]

    def restore_engine(self, old: Any, new: Any) -> bool:
        """Load the last pushed weights into a rebuilt inference actor; whether rank 0 could."""
        bound = (self.push_timeout_s, None)
        return bool(self._all("restore_engine", old, new, ranks=[0], deadline=bound)[0])

    def save(self, step: int, extra: dict[str, Any], metrics: dict[str, float]) -> str:
        """Write the checkpoint of ``step``; its path."""
        return self._all("save", step, extra, metrics, stop_on_error=True)[0]

    def shutdown(self) -> None:
        """Stop every rank (leaving the process group when they still can)."""
        import ray

        try:
            ray.get([rank.shutdown.remote() for rank in self.ranks], timeout=30)
        except Exception as error:  # a dead or hung rank: it is killed below
            logger.debug("trainer ranks did not leave their group cleanly: %s", error)
        for rank in self.ranks:
            ray.kill(rank)
        self.ranks = []

    def _all(
        self,
        method: str,
        *args: Any,
        ranks: list[int] | None = None,
        stop_on_error: bool = False,
        deadline: tuple[float, int | None] | None = None,
    ) -> list[Any]:
        chosen = range(self.world_size) if ranks is None else ranks
        refs = [getattr(self.ranks[r], method).remote(*args) for r in chosen]
        return self._wait(refs, method, list(chosen), stop_on_error, deadline)

    def _wait(
        self,
        refs: list[Any],
        what: str,
        ranks: list[int] | None = None,
        stop_on_error: bool = False,
        deadline: tuple[float, int | None] | None = None,
    ) -> list[Any]:
        """The results of ``refs`` (one per rank). A rank that died raises
        :class:`TrainerRankDied` after every rank was killed; an error raised by a call is
        raised as it is, after killing the ranks when ``stop_on_error`` (the call was a
        collective the other ranks would wait in). With ``deadline`` (seconds, and the version
        the call pushes), a call still running then kills the ranks and raises
        :class:`~llmrl.core.deadlines.CallTimeout` naming the first rank still busy."""
        import ray

        ranks = list(range(len(refs))) if ranks is None else ranks
        pending = list(refs)
        clock = None if deadline is None else Deadline(deadline[0])
        while pending:
            left = None if clock is None else clock.left()
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                assert clock is not None and deadline is not None
                if clock.left() > 0:  # ray.wait returned a little early: wait the rest
                    continue
                self._stop_hung(ranks[refs.index(pending[0])], what, clock, deadline[1])
            try:
                ray.get(done[0])
            except Exception as error:
                rank = ranks[refs.index(done[0])]
                # a call that raised (even an actor death it saw elsewhere) left its rank alive
                died = is_actor_death(error) and not isinstance(error, ray.exceptions.RayTaskError)
                if died or stop_on_error:
                    for actor in self.ranks:
                        ray.kill(actor)
                if died:
                    raise TrainerRankDied(
                        f"trainer rank {rank} died during {what}: {first_line(error)}; the "
                        "other ranks were stopped. Re-run the stage to resume from the last "
                        "checkpoint."
                    ) from error
                raise
        return ray.get(refs)

    def _stop_hung(self, rank: int, what: str, clock: Deadline, version: int | None) -> None:
        """Kill every rank (one is stuck, the group with it) and raise the timeout."""
        import ray

        for actor in self.ranks:
            ray.kill(actor)
        setting = "runtime.timeouts.weight_push_s + runtime.collective_timeout_s"
        hung = Hung(role="trainer rank", index=rank, call=what, version=version, setting=setting)
        raise CallTimeout(hung, clock.timeout_s, "the ranks were stopped; re-run to resume")


def split_groups(
    batch: TensorDictBase, group_size: int, parts: int, by_tokens: bool = False
) -> list[tuple[TensorDictBase, bool]]:
    """``batch`` (whole groups of ``group_size`` trajectories on consecutive rows: one row per
    trajectory, or one per turn of multi-turn episodes) cut into ``parts`` shards of whole
    groups, as even as possible in groups, or with ``by_tokens`` in tokens (the costliest group
    first, each to the shard with the fewest tokens so far: token-budget micro-batches, where a
    rank's time follows its tokens); ``(shard, stand_in_only)``. With fewer groups than parts,
    the extra shards repeat the first group, flagged to be trained on with weight 0."""
    spans = _group_spans(batch, group_size)
    if by_tokens:
        lengths = sequence_lengths(batch)
        costs = [sum(lengths[span]) for span in spans]
        members = balanced_assignment(costs, parts)
    else:
        bounds = [round(len(spans) * i / parts) for i in range(parts + 1)]
        members = [list(range(first, last)) for first, last in itertools.pairwise(bounds)]
    shards = []
    for groups in members:
        if groups:
            rows = [row for group in groups for row in range(spans[group].start, spans[group].stop)]
            shards.append((take(batch, rows), False))
        else:
            shards.append((batch[spans[0]], True))
    return shards


def _group_spans(batch: TensorDictBase, group_size: int) -> list[slice]:
    """The rows of each group: runs of equal ``group_id`` (each checked to hold ``group_size``
    trajectories), or without ids, every ``group_size`` rows."""
    rows = batch.batch_size[0]
    if batch.get("group_id", None) is None:
        if rows % group_size:
            raise ValueError(f"a batch of {rows} rows is not made of whole groups of {group_size}")
        return [slice(start, start + group_size) for start in range(0, rows, group_size)]
    spans = group_slices(batch)
    trajectories = batch.get("traj_id", None)
    for span in spans:
        count = span.stop - span.start
        if trajectories is not None:
            count = len(set(trajectories[span].reshape(-1).tolist()))
        if count != group_size:
            group = batch.get("group_id")[span.start].item()
            raise ValueError(
                f"group {group} of the batch has {count} trajectories, not a whole group of "
                f"{group_size}"
            )
    return spans
