"""`RayLLMCollector`: the :class:`~llmrl.collectors.LLMCollector` loop over Ray actors.

Who calls whom:

- the **driver** (this process, the trainer) owns the :class:`RayLLMCollector`. To fill a
  batch it asks every env worker for its share of the missing transitions
  (``worker.collect.remote(n)``), waits for all of them (``ray.get``), then takes what they
  sent from the rollout transport's receiver (:func:`~llmrl.transports.rollouts.ray_rollouts`,
  an inbox actor), in worker order: a pull model, with no collection running while the trainer
  trains, so a weight update applies to everything collected after it;
- each **env worker** (:class:`EnvWorker` actor) owns an env built by
  ``env_factory(worker_index)`` and runs the single-process loop
  (:class:`~llmrl.collectors.llm_collector.TrajectoryRunner`): reset, a remote policy call,
  ``env.step`` locally, until its trajectories finished at least ``n`` transitions, which it
  sends (``RolloutSender.send``: every sample must carry its ``policy_version``) with its
  state (trajectories in progress stay with it for the next call);
- each **inference actor** (:class:`InferenceActor`) owns a policy built by
  ``policy_factory()`` and serves ``generate(state)``. It is a threaded actor
  (``max_concurrency`` = its workers + 1), so concurrent worker calls reach the policy
  together and its request batching (``min_batch_size`` / ``max_batch_size``) serves them in
  one model call. It stamps ``policy_version``: the version of the weights that replied.

Weights go from the driver to the inference actors through a
:class:`~llmrl.transports.WeightUpdater` (default: the Ray object store).

**Faults.** An actor whose process dies mid-batch (killed, out of memory) is rebuilt by the
driver, and the batch completes:

- an inference actor is rebuilt with ``policy_factory()``, then gets the last pushed weights and
  the current version (:meth:`RayObjectStoreWeightUpdater.restore`); the env workers it served
  keep their trajectories in progress and retry the reply they were waiting for on the new one;
- an env worker is rebuilt with ``env_factory(index)`` and the state it reported at the end of
  its last successful ``collect`` (next trajectory id, dataset position): what it produced in
  the call that died is produced again, by the replacement, under the same trajectory ids.

**Hangs.** Every wait has a deadline (``timeouts``,
:class:`~llmrl.config.runtime_settings.RuntimeTimeouts`): an env worker's ``collect``
(``env_worker_s``), an env worker's call to its engine (``engine_call_s``, in the worker), a
push (``weight_push_s``, in the weight updater), actors starting (``startup_s``). An env worker
or an engine that runs past one is killed and then rebuilt as a dead one, within the same
``max_actor_restarts``; with no rebuild left the :class:`~llmrl.core.deadlines.CallTimeout`
naming it (role, index, phase, version, round) stops the run.

Ray's own actor restarts (``max_restarts``) are not used: they rerun the constructor, which
would bring an inference actor back with the factory's weights and version 0, and an env worker
back at the start of its dataset. Each rebuild counts in ``stats["env_worker_restarts"]`` or
``stats["inference_actor_restarts"]`` (``collector/...`` in :meth:`~CollectorBase.metrics`);
one slot dying more than ``max_actor_restarts`` times raises
:class:`~llmrl.collectors.actor_faults.ActorRestartsExhausted`, naming it.
How many actors of each kind run, and the Ray options of each, is one
:class:`~llmrl.collectors.ray_layout.ActorLayout`: fractional CPUs by default, so an inference
actor and two env workers fit a 2-CPU machine (``ActorLayout.uniform(inference_gpus=1)`` on a
GPU machine).

Example (``make_env``, ``make_policy``, ``train_on`` and ``trainer_model`` are yours)::

    collector = RayLLMCollector(
        env_factory=partial(make_env, seed=0),
        policy_factory=make_policy,
        actors=ActorLayout.uniform(env_workers=2),
        dialog_turns_per_batch=64,
        total_dialog_turns=6400,
    )
    for batch in collector:
        train_on(batch)
        collector.update_policy_weights_(trainer_model)
    collector.shutdown()
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from llmrl.collectors.actor_faults import (
    RestartBudget,
    dead_actors,
    first_line,
    is_actor_death,
    kill_hung,
)
from llmrl.collectors.llm_collector import CollectorBase
from llmrl.collectors.ray_actors import EnvWorker, InferenceActor
from llmrl.collectors.ray_layout import ActorLayout
from llmrl.config.runtime_settings import RuntimeTimeouts
from llmrl.core.deadlines import CallTimeout, Deadline, Hung, cause_of, wait_for
from llmrl.core.ray_helpers import import_ray
from llmrl.transports.object_store import RayObjectStoreWeightUpdater
from llmrl.transports.rollouts import ray_rollouts

if TYPE_CHECKING:
    from llmrl.data.replay import ReplayBuffer
    from llmrl.envs.chat_env import ChatEnv
    from llmrl.transports.weights import WeightUpdater

logger = logging.getLogger(__name__)


class RayLLMCollector(CollectorBase):
    """Collects with env worker actors and inference actors (see the module docstring).

    Args:
        env_factory: picklable ``env_factory(worker_index) -> ChatEnv`` (give workers
            different seeds, or the same dataset order twice).
        policy_factory: picklable ``policy_factory() -> policy``, called in each inference
            actor; or a list, one factory per inference actor.
        dialog_turns_per_batch, total_dialog_turns, replay_buffer, yield_completed_trajectories:
            as for :class:`~llmrl.collectors.LLMCollector`.
        actors: how many env workers and inference actors, and the Ray options of each
            (:class:`~llmrl.collectors.ray_layout.ActorLayout`; default
            ``ActorLayout.uniform()``: two env workers and one inference actor, half a CPU
            each).
        weight_updater: default a :class:`RayObjectStoreWeightUpdater` over the inference
            actors.
        runtime_env: Ray runtime environment of every actor (e.g. ``{"env_vars": {...}}``).
        max_actor_restarts: rebuilds allowed per actor after its process died (see the module
            docstring); 0 fails at the first death.
        timeouts: the deadlines of the actors' calls (default: the config's defaults).
        runner_factory: what each env worker steps its env with (default its
            :class:`~llmrl.collectors.llm_collector.TrajectoryRunner`); the runners' ``stats``
            are summed into this collector's (partial rollouts: ``resumed_rows``...).

    Ray is started (``ray.init()``) if it is not running. Call :meth:`shutdown` at the end.
    """

    def __init__(
        self,
        *,
        env_factory: Callable[[int], ChatEnv],
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]],
        dialog_turns_per_batch: int,
        actors: ActorLayout | None = None,
        total_dialog_turns: int = -1,
        replay_buffer: ReplayBuffer | None = None,
        weight_updater: WeightUpdater | None = None,
        yield_completed_trajectories: bool = True,
        runtime_env: dict[str, Any] | None = None,
        max_actor_restarts: int = 3,
        runner_factory: Callable[..., Any] | None = None,
        timeouts: RuntimeTimeouts | None = None,
    ) -> None:
        super().__init__(
            dialog_turns_per_batch=dialog_turns_per_batch,
            total_dialog_turns=total_dialog_turns,
            replay_buffer=replay_buffer,
            weight_updater=weight_updater,
            yield_completed_trajectories=yield_completed_trajectories,
        )
        ray = import_ray("RayLLMCollector")
        if not ray.is_initialized():
            ray.init()
        layout = actors or ActorLayout.uniform()
        self.timeouts = timeouts or RuntimeTimeouts()
        self._budget = RestartBudget(max_actor_restarts)
        self.stats.update(env_worker_restarts=0, inference_actor_restarts=0)
        extra: dict[str, Any] = {} if runtime_env is None else {"runtime_env": runtime_env}
        # env workers -> driver: trajectories travel through the rollout transport
        self._rollout_sender, self._rollout_receiver = ray_rollouts(actor_options=extra)
        self._round = 0
        self._runner_factory = runner_factory
        self._runner_stats: dict[int, dict[str, int]] = {}  # env worker -> its runner's stats
        self._define_actors(layout, extra, env_factory, policy_factory)
        self._start_actors(len(layout.inference), len(layout.env_workers))
        if weight_updater is None:
            self.weight_updater = RayObjectStoreWeightUpdater(self.inference_actors)
            self.weight_updater.push_timeout_s = self.timeouts.weight_push_s
        workers = len(self.env_workers)
        self._worker_done = [False] * workers
        # each worker's state after its last successful collect: what a replacement starts from
        self._worker_states: list[dict[str, Any] | None] = [None] * workers

    def _define_actors(
        self,
        layout: ActorLayout,
        extra: dict[str, Any],
        env_factory: Callable[[int], ChatEnv],
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]],
    ) -> None:
        """How to build inference actor ``i`` and env worker ``j`` (again, after a death)."""
        count = len(layout.inference)
        factories = (
            list(policy_factory)
            if isinstance(policy_factory, (list, tuple))
            else [policy_factory] * count
        )
        by_trajectory = self.yield_completed_trajectories
        self._new_inference_actor = lambda index: _start_actor(
            InferenceActor,
            layout.inference_options(index, extra),
            policy_factory=factories[index],
            version_key="policy_version",
            engine=index,
        )
        self._new_env_worker = lambda index, inference_actor: _start_actor(
            EnvWorker,
            layout.env_worker_options(index, extra),
            env_factory=env_factory,
            worker_index=index,
            num_workers=len(layout.env_workers),
            inference_actor=inference_actor,
            yield_completed_trajectories=by_trajectory,
            rollout_sender=self._rollout_sender,
            runner_factory=self._runner_factory,
            engine_call_s=self.timeouts.engine_call_s,
        )

    def _start_actors(self, inference_actors: int, env_workers: int) -> None:
        """Start every actor and wait until each is built (a factory's error surfaces here,
        and leaves no actor behind)."""
        self.inference_actors = [self._new_inference_actor(i) for i in range(inference_actors)]
        self.env_workers = [
            self._new_env_worker(i, self._inference_of(i)) for i in range(env_workers)
        ]
        actors = [*self.inference_actors, *self.env_workers]
        hung = [
            *self._hung("inference engine", "ready (start)", "startup_s", range(inference_actors)),
            *self._hung("env worker", "ready (start)", "startup_s", range(env_workers)),
        ]
        try:
            wait_for([actor.ready.remote() for actor in actors], self.timeouts.startup_s, hung)
        except Exception:
            self.shutdown()
            raise

    def _inference_of(self, worker_index: int) -> Any:
        return self.inference_actors[worker_index % len(self.inference_actors)]

    def _hung(self, role: str, call: str, setting: str, indices: Sequence[int]) -> list[Hung]:
        """What each call of ``role`` ``indices`` waited for (for a timeout's message)."""
        version, setting = self.policy_version, f"runtime.timeouts.{setting}"
        hung = Hung(role=role, call=call, version=version, round=self._round, setting=setting)
        return hung.each(indices)

    def _engine_hung(self, engine: int, timeout: CallTimeout, **fields: Any) -> CallTimeout:
        """Engine ``engine`` ran past a deadline (an env worker's call or a push): killed, to
        be rebuilt (or the timeout, with ``fields`` named, raised when it may not be)."""
        timeout = timeout.with_details(index=engine, **fields)
        actor, name = self.inference_actors[engine], f"inference actor {engine}"
        logger.warning("%s", timeout)
        return kill_hung(actor, name, self._budget, timeout)

    def _collect_more(self) -> None:
        live = [i for i, done in enumerate(self._worker_done) if not done]
        missing = self.dialog_turns_per_batch - self._assembler.pending_turns
        share = max(1, math.ceil(missing / len(live)))
        self._round += 1
        calls = {i: self.env_workers[i].collect.remote(share, self._round) for i in live}
        deadline = Deadline(self.timeouts.env_worker_s)  # the calls run together
        faults: list[BaseException] = []
        for index, call in calls.items():
            (hung,) = self._hung("env worker", "collect", "env_worker_s", [index])
            try:
                wait_for(call, deadline, hung)  # returns once its worker's batch is in the inbox
            except CallTimeout as error:
                if cause_of(error) is not error:  # raised by the worker's own code
                    raise
                logger.warning("%s", error)
                name = f"env worker {index}"
                faults.append(kill_hung(self.env_workers[index], name, self._budget, error))
            except Exception as error:
                if not is_actor_death(error):
                    raise
                faults.append(error)  # its share is asked for again in the next round
        # a worker that died after sending counts what it sent (its state came with it)
        received = self._rollout_receiver.receive_ready()
        for batch in sorted(received, key=lambda batch: batch.source):
            info, index = batch.info, batch.source
            if info.get("round") != self._round:  # sent by a worker that died in an old round
                logger.warning("dropped a late rollout batch of env worker %d", index)
                continue
            self._record(batch.trajectories, info["turns"], info["trajectories"])
            self._worker_done[index] = bool(info["exhausted"])
            self._worker_states[index] = info["state"]
            self._runner_stats[index] = info.get("runner", {})
            if info.get("inference_timeout") is not None:  # its engine hung: kill, rebuild
                engine = index % len(self.inference_actors)
                timeout = info["inference_timeout"]
                version = self.policy_version
                faults.append(
                    self._engine_hung(engine, timeout, round=self._round, version=version)
                )
            if "inference_error" in info:
                faults.append(RuntimeError(info["inference_error"]))
            logger.debug(
                "env worker %d: %d turns, %d trajectories finished%s",
                index,
                info["turns"],
                info["trajectories"],
                " (dataset exhausted)" if info["exhausted"] else "",
            )
        if faults:
            self._replace_dead_actors(faults[0])

    def _replace_dead_actors(self, fault: BaseException) -> None:
        """Rebuild every dead inference actor, then every dead env worker (see the module
        docstring); ``fault`` is re-raised when no actor is dead."""
        timeouts = self.timeouts
        dead_inference = dead_actors(
            self.inference_actors, timeouts.engine_call_s, "inference engine"
        )
        for index, error in dead_inference.items():
            self._budget.spend(f"inference actor {index}", error)
            old, new = self.inference_actors[index], self._new_inference_actor(index)
            self.inference_actors[index] = new
            # built first, within startup_s: the restore's deadline is for loading alone
            (starting,) = self._hung("inference engine", "rebuild", "startup_s", [index])
            wait_for(new.ready.remote(), timeouts.startup_s, starting)
            updater = self.weight_updater
            restored = updater.restore(old, new)
            if not restored and self.policy_version > 0:
                raise RuntimeError(
                    f"inference actor {index} died and was rebuilt, but the weight updater "
                    f"{type(updater).__name__} cannot reload version "
                    f"{self.policy_version} into it"
                ) from error
            (hung,) = self._hung("inference engine", "set_version", "engine_call_s", [index])
            wait_for(new.set_version.remote(self.policy_version), timeouts.startup_s, hung)
            self.stats["inference_actor_restarts"] += 1
            logger.warning("inference actor %d died (%s); rebuilt it", index, first_line(error))
        dead_workers = dead_actors(self.env_workers, timeouts.env_worker_s, "env worker")
        for index, error in dead_workers.items():
            self._budget.spend(f"env worker {index}", error)
            worker = self._new_env_worker(index, self._inference_of(index))
            self.env_workers[index] = worker
            state = self._worker_states[index]  # None: nothing collected yet, start afresh
            (hung,) = self._hung("env worker", "rebuild", "startup_s", [index])
            if state is not None:
                wait_for(worker.load_state_dict.remote(state), timeouts.startup_s, hung)
            wait_for(worker.ready.remote(), timeouts.startup_s, hung)
            self.stats["env_worker_restarts"] += 1
            logger.warning("env worker %d died (%s); rebuilt it", index, first_line(error))
        if not dead_inference and not dead_workers:
            raise fault
        moved = [
            i
            for i in range(len(self.env_workers))
            if i not in dead_workers and i % len(self.inference_actors) in dead_inference
        ]
        wait_for(
            [self.env_workers[i].set_inference_actor.remote(self._inference_of(i)) for i in moved],
            timeouts.env_worker_s,
            self._hung("env worker", "set_inference_actor", "env_worker_s", moved),
        )

    def _exhausted(self) -> bool:
        return all(self._worker_done)

    def update_policy_weights_(self, weights: Any = None) -> Any:
        """Push ``weights`` to the inference actors and advance the version (see
        :meth:`LLMCollector.update_policy_weights_`); the push delivers the new version to
        the actors, which stamp it.

        An inference actor found dead by the push is rebuilt (with the weights of the push
        that failed, which the updater already holds) and the push is made again. An engine
        the push names as hung (the updater's :class:`~llmrl.core.deadlines.CallTimeout`) is
        killed and rebuilt the same way, or the timeout stops the run when it may not be."""
        try:
            return super().update_policy_weights_(weights)
        except Exception as error:
            timeout = cause_of(error)
            engine = timeout.hung.index if isinstance(timeout, CallTimeout) else None
            if engine is not None and timeout.hung.role == "inference engine":
                self._engine_hung(engine, timeout.with_details(version=self.policy_version + 1))
            elif not is_actor_death(error) or not dead_actors(self.inference_actors):
                raise
            self._replace_dead_actors(error)
            return super().update_policy_weights_(weights)

    def metrics(self) -> dict[str, float]:
        """``collector/*``: the collector's counters and its env workers' runners' (summed)."""
        metrics = super().metrics()
        for stats in self._runner_stats.values():
            for name, value in stats.items():
                key = f"collector/{name}"
                metrics[key] = metrics.get(key, 0.0) + float(value)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Counters, policy version and every worker's state (next ids, dataset position)."""
        refs = [worker.state_dict.remote() for worker in self.env_workers]
        hung = self._hung("env worker", "state_dict", "env_worker_s", range(len(refs)))
        workers = wait_for(refs, self.timeouts.env_worker_s, hung)
        return {
            "stats": dict(self.stats),
            "policy_version": self.policy_version,
            "workers": workers,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on the same number of workers."""
        if len(state["workers"]) != len(self.env_workers):
            raise ValueError(
                f"state has {len(state['workers'])} workers, this collector {len(self.env_workers)}"
            )
        self.stats = {"env_worker_restarts": 0, "inference_actor_restarts": 0, **state["stats"]}
        self._set_version(int(state["policy_version"]))
        engines, workers = self.inference_actors, self.env_workers
        wait_for(
            [a.set_version.remote(self.policy_version) for a in engines],
            self.timeouts.engine_call_s,
            self._hung("inference engine", "set_version", "engine_call_s", range(len(engines))),
        )
        wait_for(
            [w.load_state_dict.remote(s) for w, s in zip(workers, state["workers"], strict=True)],
            self.timeouts.env_worker_s,
            self._hung("env worker", "load_state_dict", "env_worker_s", range(len(workers))),
        )
        self._worker_done = [False] * len(self.env_workers)
        self._worker_states = list(state["workers"])
        self._drop_pending()

    def shutdown(self, close_timeout_s: float = 10.0) -> None:
        """Close the env workers' envs (stopping tool servers cleanly; bounded by
        ``close_timeout_s``, a dead or stuck worker is killed regardless), then kill the env
        workers, the inference actors and the rollout inbox (Ray itself keeps running)."""
        ray = import_ray("RayLLMCollector")
        closing = [worker.close.remote() for worker in self.env_workers]
        if closing:
            _, stuck = ray.wait(closing, num_returns=len(closing), timeout=close_timeout_s)
            if stuck:
                logger.warning("%d env worker(s) did not close in time; killing", len(stuck))
        inbox = [self._rollout_receiver.inbox] if self._rollout_receiver is not None else []
        for actor in [*self.env_workers, *self.inference_actors, *inbox]:
            ray.kill(actor)
        self.env_workers, self.inference_actors, self._rollout_receiver = [], [], None


def _start_actor(cls: type, options: dict[str, Any], **kwargs: Any) -> Any:
    """A Ray actor of ``cls`` with ``options``, constructed with ``kwargs``."""
    ray = import_ray("RayLLMCollector")
    return ray.remote(cls).options(**options).remote(**kwargs)
