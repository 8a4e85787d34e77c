"""`GRPORuntime`: the GRPO stage's roles placed on Ray, and one step across them.

Built from a :class:`~llmrl.config.grpo.GRPOConfig` and its :class:`~llmrl.topology.Topology`:

- **placement**: :func:`~llmrl.topology.place_on_ray` reserves every role's bundles;
- **inference engines** (:mod:`llmrl.runtime.engines`) behind
  :class:`~llmrl.collectors.InferenceActor` fronts that batch the env workers' requests;
- **env workers**: a :class:`~llmrl.collectors.RayLLMCollector` whose workers each run a
  :class:`~llmrl.envs.task_env.TaskEnv` over their shard of the prompts (rewards there);
  dead engines and workers are rebuilt mid-step;
- **trainer ranks**: a :class:`~llmrl.runtime.trainer_group.TrainerGroup` (DDP / FSDP2);
  colocated, the vLLM engines sleep while they train (:mod:`llmrl.runtime.colocation`);
- **reference**: in each rank, or a dedicated actor scoring in the driver;
- **model roles** (:mod:`llmrl.runtime.model_roles`): a judge and a reward model the env
  workers call for their rewards, a teacher scoring the trained rows in the driver;
- **rollouts** (:class:`~llmrl.collectors.AsyncRollouts`): sampling runs in a background
  thread, at most ``max_staleness`` versions ahead (0 in ``sync`` mode); with
  ``runtime.partial_rollouts`` replies are sampled a segment at a time and carried across
  batches and pushes (:mod:`llmrl.collectors.partial_rollouts`).

Its step is :func:`~llmrl.runtime.grpo_step.grpo_step` over the runtime's parts (the same
function the in-process composition and the benchmarks call)::

    batch = next(rollouts)                 # collect(): prompts x G responses, rewards, versions
    batch = advantage(batch)               # the sampler: group-relative, on the whole batch
    metrics = trainers.train(batch)        # train(): each rank its groups, loss, backward, step
    rollouts.update_policy_weights_()      # push_weights(): rank 0 -> engines; version + 1

With ``advantage.drop_zero_std`` the first two lines are dynamic sampling
(:class:`~llmrl.collectors.DynamicSampler`): groups without reward signal are dropped and more
batches are drawn, at the same policy version, until ``prompts_per_step`` groups with signal
are found (at most ``advantage.max_resample_rounds`` extra batches; each is a whole step's
batch, every env worker drawing its share again).

The driver (this process) holds no model: weights go from rank 0 to the engines directly.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import yaml
from tensordict import TensorDictBase

from llmrl.collectors import ActorLayout, AsyncRollouts, RayLLMCollector
from llmrl.config.grpo import TOPOLOGY_ENV, GRPOConfig, topology_problems
from llmrl.core.config_loading import ConfigError
from llmrl.core.deadlines import CallTimeout, Hung, cause_of, wait_for
from llmrl.data.prepare import load_prepared
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.runtime.colocation import EngineSleep, refuse_without_sleep_mode
from llmrl.runtime.driver_parts import build_driver_parts
from llmrl.runtime.engines import EngineSet, inference_actor_options, start_engines
from llmrl.runtime.env_workers import TaskEnvFactory, env_worker_options
from llmrl.runtime.grpo_step import COUNTERS, grpo_step
from llmrl.runtime.trainer_group import TrainerGroup
from llmrl.topology import Topology, place_on_ray
from llmrl.train.audit import AuditError
from llmrl.transports.selection import engine_weight_backend

logger = logging.getLogger(__name__)

VERSION_HISTORY = 1000
"""Steps whose sample versions :attr:`GRPORuntime.trained_versions` keeps."""


def resolve_topology(config: GRPOConfig) -> Topology:
    """The config's topology, else the one in ``$LLMRL_TOPOLOGY`` (the chart's, mounted in stage
    pods; a Topology or a Helm values file with a ``topology`` section), else the local
    default; checked against the config.

    Raises:
        ConfigError: the topology file is unreadable or cannot run this config.
    """
    topology, source = config.topology, "config"
    if topology is None and os.environ.get(TOPOLOGY_ENV):
        path = Path(os.environ[TOPOLOGY_ENV])
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            topology = Topology.model_validate(data.get("topology", data))
        except (OSError, ValueError) as error:
            raise ConfigError([f"{TOPOLOGY_ENV}: {path}: {error}"]) from None
        source = str(path)
    if topology is None:
        topology, source = Topology.local_default(), "local default"
    problems = topology_problems(config, topology)
    if problems:
        raise ConfigError([f"topology ({source}): {line}" for line in problems])
    logger.info("GRPO topology (%s): %s", source, describe(topology))
    return topology


def describe(topology: Topology) -> str:
    """One line: the roles and their counts."""
    inference, trainer = topology.inference, topology.trainer
    return (
        f"{inference.engines} {inference.backend} engine(s), {topology.env_workers.count} env "
        f"worker(s), {trainer.world_size} trainer rank(s) ({trainer.strategy}, "
        f"{trainer.gpus} GPU(s)), reference {topology.reference.placement}, "
        f"{'colocated' if topology.colocated else 'disaggregated'}"
        + "".join(
            f", {name} ({spec.url or f'{spec.engines} {spec.backend} engine(s)'})"
            for name, spec in topology.model_roles().items()
        )
    )


class GRPORuntime:
    """Every role of a GRPO run on Ray (see the module docstring); :meth:`shutdown` at the end.

    Args:
        config: the stage config.
        topology: where the roles run (:func:`resolve_topology`).
        resume_from: a checkpoint to continue from (weights, optimizer, collector state).
        resume_state: that checkpoint's ``extra`` (collector and counters).
        runtime_env: Ray runtime environment of every actor.
    """

    def __init__(
        self,
        *,
        config: GRPOConfig,
        topology: Topology,
        resume_from: str | None = None,
        resume_state: dict[str, Any] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        self.config, self.topology = config, topology
        self.task, self.manifest = prepared_task(config.data.path)
        train_rows, _ = load_prepared(config.data.path)
        self.train_rows = train_rows[: config.data.max_train_rows]
        if not self.train_rows:
            raise ConfigError([f"data.path: {config.data.path}: the train split is empty"])
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.trained_versions: deque[tuple[int, list[int]]] = deque(maxlen=VERSION_HISTORY)
        """(trainer version, the policy_version of every sample the step consumed: trained, or
        dropped by dynamic sampling) of the last steps."""
        self._parts: list[Any] = []  # what shutdown() stops, in reverse order
        try:
            self._start(resume_from, resume_state or {}, runtime_env)
        except BaseException:
            self.shutdown()
            raise

    def _start(
        self, resume_from: str | None, state: dict[str, Any], runtime_env: dict[str, Any] | None
    ) -> None:
        """Place the roles, then start them; each step leaves in ``_parts`` how to stop what
        it started."""
        refuse_without_sleep_mode(self.topology)  # colocated on vLLM's CPU build: no actor
        tick = time.perf_counter()
        timeout_s = self.config.runtime.placement_timeout_s
        self.placement = place_on_ray(self.topology, timeout_s=timeout_s)
        self._parts.append(self.placement.remove)
        engines = self._start_engines(runtime_env)
        self._start_model_roles(runtime_env)
        self._start_collector(engines, runtime_env)
        self._start_trainers(engines, resume_from, runtime_env)
        self._start_reference(runtime_env)
        self._start_rollouts(state, resume_from)
        elapsed = time.perf_counter() - tick
        logger.info("GRPO runtime up in %.1f s: %s", elapsed, describe(self.topology))

    def _start_engines(self, runtime_env: dict[str, Any] | None) -> EngineSet:
        """The inference engines, on their bundles; each serves its share of a step's rows in
        one model call."""
        config, settings, topology = self.config, self.config.runtime, self.topology
        rows_per_step = config.prompts_per_step * config.num_samples
        engines = start_engines(
            placement=self.placement,
            model=config.model.spec,
            dtype=config.model.dtype,
            generate_kwargs=config.generation.as_kwargs(),
            batch_rows=math.ceil(rows_per_step / self.placement.specs.inference.count),
            batching_timeout_s=settings.batching_timeout_s,
            threads=settings.torch_threads,
            runtime_env=runtime_env,
            seed=config.seed,
            compile_decode=settings.compile_decode,
            load_options=config.model.load_options,
            partial_rollouts=settings.partial_rollouts,
            segment_tokens=self._segment_tokens(),
            weight_backend=engine_weight_backend(  # ranks with no GPUs see no CUDA
                topology.weight_transport, topology.colocated, cuda=topology.trainer.gpus > 0
            ),
            lora=config.lora.adapter_config() if config.lora.pushes_adapter else None,
        )
        self._parts.append(lambda: _kill(engines.vllm_engines))
        self.vllm_engines = engines.vllm_engines
        """The ``VLLMEngine`` actors behind the inference actors (empty for transformers)."""
        return engines

    def _segment_tokens(self) -> int | None:
        """Partial rollouts' segment (None: off)."""
        settings = self.config.runtime
        if not settings.partial_rollouts:
            return None
        budget = self.config.generation.max_new_tokens
        return settings.segment_length(budget, self.topology.inference.backend)

    def _segment_param(self) -> int | str:
        """The segment cap the engines got, as an MLflow param ("off": no partial rollouts)."""
        if not self.config.runtime.partial_rollouts:
            return "off"
        return self._segment_tokens() or "none"

    def _start_model_roles(self, runtime_env: dict[str, Any] | None) -> None:
        """The teacher, judge and reward model the topology sets, on their bundles (or by
        their URL)."""
        from llmrl.runtime.model_roles import start_model_roles

        self.model_roles = start_model_roles(
            config=self.config,
            topology=self.topology,
            placement=self.placement,
            runtime_env=runtime_env,
        )
        self._parts.append(self.model_roles.shutdown)

    def _start_collector(self, engines: EngineSet, runtime_env: dict[str, Any] | None) -> None:
        """The env workers (each over its shard of the prompts) and the inference actors in
        front of the engines, sized and placed by the placement's role specs."""
        config = self.config
        workers = self.topology.env_workers.count
        env_factory = TaskEnvFactory(
            task=self.task,
            rows=self.train_rows,
            num_workers=workers,
            prompts_per_worker=config.prompts_per_step // workers,
            num_samples=config.num_samples,
            seed=config.seed,
            tools=config.tools,
            rewards=config.rewards,
            scorers={n: c for n, c in self.model_roles.clients.items() if n != "teacher"},
        )
        actors = ActorLayout(
            inference=tuple(inference_actor_options(self.placement)),
            env_workers=tuple(env_worker_options(self.placement)),
        )
        self.collector = RayLLMCollector(
            env_factory=env_factory,
            policy_factory=engines.factories,
            actors=actors,
            dialog_turns_per_batch=config.prompts_per_step * config.num_samples,
            runtime_env=runtime_env,
            max_actor_restarts=config.runtime.max_actor_restarts,
            timeouts=config.runtime.timeouts,
            runner_factory=self._runner_factory(),
        )
        self._parts.append(self.collector.shutdown)

    def _runner_factory(self) -> Any:
        """With partial rollouts, the env workers' segment-at-a-time runner; else theirs."""
        if not self.config.runtime.partial_rollouts:
            return None
        from llmrl.collectors.partial_rollouts import partial_runner_factory

        # sampling runs one batch ahead (lead 1): a batch trains one version after its last
        # tokens, so a reply may start max_staleness - 1 versions before the engine's
        return partial_runner_factory(self.config.num_samples, self.config.max_staleness - 1)

    def _start_trainers(
        self, engines: EngineSet, resume_from: str | None, runtime_env: dict[str, Any] | None
    ) -> None:
        """The trainer ranks; rank 0 then pushes the collector's weights to the engines."""
        self.trainers = TrainerGroup(
            config=self.config,
            topology=self.topology,
            placement=self.placement,
            resume_from=resume_from,
            runtime_env=runtime_env,
        )
        self._parts.append(self.trainers.shutdown)
        self.trainers.connect_engines(
            inference_actors=self.collector.inference_actors,
            vllm_engines=engines.vllm_engines,
            ranks_per_engine=self.placement.specs.inference.tensor_parallel_size,
            transport=self.topology.weight_transport,
            colocated=self.topology.colocated,
        )
        self.engine_sleep = EngineSleep.of(self.config, self.topology, engines.vllm_engines)
        self.collector.weight_updater = self.engine_sleep.weight_updater(self.trainers)

    def _start_reference(self, runtime_env: dict[str, Any] | None) -> None:
        """The dedicated reference actor, when the config uses a reference and the topology
        gives it its own GPUs (else the ranks hold it, or there is none)."""
        self.reference = None
        if not self.config.reference or self.placement.specs.reference is None:
            return
        from llmrl.runtime.reference import start_reference_actor

        model = self.config.model
        self.reference = start_reference_actor(
            placement=self.placement,
            model=model.spec,
            dtype=model.dtype,
            runtime_env=runtime_env,
            load_options=model.load_options,
            packing=model.packing,
        )
        self._parts.append(lambda: _kill([self.reference]))

    def _start_rollouts(self, state: dict[str, Any], resume_from: str | None) -> None:
        """The advantage, dynamic sampling, the audit and the rollouts thread; a resumed run
        restores their state and gives the engines the trained weights."""
        config = self.config
        parts = build_driver_parts(config, reference=self._reference_scorer())
        self.advantage, self.sampler = parts.advantage, parts.sampler
        self.shaping, self.audit = parts.shaping, parts.audit
        staleness = 0 if config.mode == "sync" else config.max_staleness
        partial = config.runtime.partial_rollouts
        self.rollouts = AsyncRollouts(
            self.collector,
            max_staleness=staleness,
            lead=1 if partial else None,  # the rest of the bound is for carried replies
            refuse_stale=partial,
        )
        self._parts.append(self.rollouts.shutdown)
        if state:
            self.rollouts.load_state_dict(state["collector"])
            self.counters.update(state.get("counters", {}))
            dropped = self.counters["dropped_zero_std_groups"]
            self.advantage.stats["dropped_zero_std_groups"] = dropped
        if resume_from is not None:
            # the engines start from the model spec; after a resume they need the trained weights
            self.collector.weight_updater.push(version=self.policy_version)
        self._iterator = iter(self.rollouts)

    def _reference_scorer(self) -> Any:
        """REINFORCE++'s KL in the reward scores the batches with the dedicated reference
        before their advantages (``advantage.kl_in_reward_coeff``); None otherwise."""
        if self.reference is None or self.config.advantage.kl_in_reward_coeff == 0:
            return None
        return self._score_with_reference

    def _score_with_reference(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` scored by the dedicated reference, within ``timeouts.reference_s``."""
        setting, seconds = "runtime.timeouts.reference_s", self.config.runtime.timeouts.reference_s
        hung = Hung(role="reference", call="score", version=self.policy_version, setting=setting)
        return wait_for(self.reference.score.remote(batch), seconds, hung)

    @property
    def policy_version(self) -> int:
        """The version of the weights the engines hold (= optimizer steps taken)."""
        return self.rollouts.policy_version

    def step(self, number: int) -> tuple[TensorDictBase, dict[str, float]]:
        """One GRPO iteration (step ``number``, 1-based): :func:`~llmrl.runtime.grpo_step.
        grpo_step` over this runtime's parts; every row sampled for it and its metrics. A
        call that hung past its deadline and could not be rebuilt raises its
        :class:`~llmrl.core.deadlines.CallTimeout` with the step named (checkpoints stay)."""
        try:
            return grpo_step(self, number)
        except CallTimeout as error:
            raise cause_of(error).with_details(step=number) from error

    # the parts grpo_step takes (StepParts): the runtime's roles behind them

    def collect(self, round_index: int) -> TensorDictBase:
        """The next batch; a resample round (``round_index > 0``) first lets the rollouts draw
        one more batch at this version."""
        if round_index > 0:
            self.rollouts.allow_extra_batch()
        return next(self._iterator)

    def train(self, trained: TensorDictBase, number: int) -> dict[str, float]:
        """The teacher (distillation) and the dedicated reference score the rows (when there
        are), then every trainer rank learns from its groups; rank 0's metrics."""
        self.engine_sleep.sleep(self.policy_version)  # colocated: the ranks take the GPUs
        trained = self.model_roles.score_with_teacher(trained)
        if self.reference is not None:
            trained = self._score_with_reference(trained)
        try:
            return self.trainers.train(trained, number)
        except AuditError as error:  # a rank's, through Ray: raised as the rank raised it
            raise getattr(error, "cause", error) from None

    def push_weights(self) -> Any:
        """Rank 0 sends the weights to the engines (between two batches); the push's stats."""
        return self.rollouts.update_policy_weights_()

    def collector_metrics(self) -> dict[str, float]:
        """``collector/*`` (turns, batches, actor restarts) and the model roles' servers'
        counters (``<role>/*``)."""
        return {**self.rollouts.metrics(), **self.model_roles.metrics()}

    def save(self, step: int, extra: dict[str, Any], metrics: dict[str, float]) -> str:
        """Checkpoint ``step`` (rank 0 writes weights and optimizer; ``extra`` gains the
        collector's state and the counters); its path."""
        state = {**extra, "collector": self.rollouts.state_dict(), "counters": dict(self.counters)}
        return self.trainers.save(step, state, metrics)

    def runtime_params(self) -> dict[str, Any]:
        """The resolved runtime, as MLflow params (``runtime.*``)."""
        topology = self.topology
        return {
            "runtime.trainer_world_size": topology.trainer.world_size,
            "runtime.inference_engines": topology.inference.engines,
            "runtime.inference_backend": topology.inference.backend,
            "runtime.env_workers": topology.env_workers.count,
            "runtime.strategy": topology.trainer.strategy,
            "runtime.colocated": topology.colocated,
            "runtime.reference": topology.reference.placement if self.config.reference else "off",
            "runtime.max_staleness": self.rollouts.max_staleness,
            # the config's runtime.partial_rollouts and runtime.segment_tokens are params too;
            # this is the cap the engines got (null in the config: it depends on the backend)
            "runtime.engine_segment_tokens": self._segment_param(),
            **{
                f"runtime.{name}": spec.url or f"{spec.engines} {spec.backend} engine(s)"
                for name, spec in topology.model_roles().items()
            },
        }

    def shutdown(self) -> None:
        """Stop every role and release the placement (idempotent; errors are logged)."""
        while self._parts:
            stop = self._parts.pop()
            try:
                stop()
            except Exception as error:  # keep stopping the rest
                logger.warning("while shutting the GRPO runtime down: %s", error)


def _kill(actors: list[Any]) -> None:
    import ray

    for actor in actors:
        ray.kill(actor)
