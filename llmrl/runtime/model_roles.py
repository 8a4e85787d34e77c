"""The model roles of the GRPO runtime: a teacher, a judge and a reward model as Ray actors.

Each role the topology sets (``topology.teacher``, ``topology.judge``,
``topology.reward_model``: :mod:`llmrl.topology.model_roles`) is either

- **placed**: ``engines`` :class:`~llmrl.scorers.server.ModelServer` actors, one on each
  engine's bundles (:attr:`~llmrl.topology.Placement.models`), each hosting the role's scorer
  (a transformers model, or a vLLM engine in the actor); Ray restarts a server that died
  (``runtime.max_actor_restarts``) and its handle stays valid; or
- **served** (``url``): nothing is started; each caller builds the scorer over the URL.

Callers hold a :class:`~llmrl.scorers.client.ModelClient` (timeout, bounded retries, a
:class:`~llmrl.scorers.errors.ModelCallError` naming the role when they run out):

- the judge and the reward model score in the env workers
  (:class:`~llmrl.envs.transforms.model_reward.ModelReward`, after the task's reward), their
  requests from every worker batched in the server;
- the teacher scores the trained rows in the driver, before the trainer ranks
  (``teacher_log_probs`` for ``loss.distillation``).

Metrics every step: each placed role's servers' ``<role>/requests``, ``<role>/rows``,
``<role>/batches``, ``<role>/call_failures`` (calls that raised; all since the start) and
``<role>/latency_s`` (mean seconds per request over the step); the env workers' per-row
``<role>/score_mean`` and ``<role>/failures`` (rows that got the fallback, a None verdict
included) come with the batch (:func:`~llmrl.runtime.grpo_step.model_reward_metrics`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.config.model_signals import ModelCallSettings
from llmrl.core.deadlines import Hung, wait_for
from llmrl.topology import Placement, Topology
from llmrl.topology.model_roles import ModelRoleSpec

if TYPE_CHECKING:
    from llmrl.scorers import ModelClient

logger = logging.getLogger(__name__)

TEACHER_CALL = ModelCallSettings(timeout_s=600.0, max_retries=1)
"""The teacher's call settings: one scoring pass over a step's trained rows (no fallback: a
step cannot train on a missing teacher signal, so a teacher that fails stops the step)."""


@dataclass(kw_only=True)
class ModelRoles:
    """The running model roles: a client per role, and the placed roles' server actors."""

    clients: dict[str, ModelClient] = field(default_factory=dict)
    servers: dict[str, list[Any]] = field(default_factory=dict)
    metrics_timeout_s: float = 600.0
    """How long :meth:`metrics` waits for the servers (``runtime.timeouts.engine_call_s``)."""
    _last: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def teacher(self) -> ModelClient | None:
        """The teacher's client (None: no distillation)."""
        return self.clients.get("teacher")

    def score_with_teacher(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``teacher_log_probs`` written (unchanged without a teacher)."""
        return batch if self.teacher is None else self.teacher.score(batch)

    def metrics(self) -> dict[str, float]:
        """Each placed role's server counters, summed over its servers (see the module
        docstring); ``<role>/latency_s`` is the mean over the requests since the last call."""
        metrics: dict[str, float] = {}
        for name, servers in self.servers.items():
            totals: dict[str, float] = {}
            setting = "runtime.timeouts.engine_call_s"
            hung = Hung(role=name, call="metrics", setting=setting).each(range(len(servers)))
            refs = [server.metrics.remote() for server in servers]
            for reported in wait_for(refs, self.metrics_timeout_s, hung):
                for key, value in reported.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
            before = self._last.get(name, {})
            if totals.get("requests", 0.0) < before.get("requests", 0.0):
                before = {}  # a server was restarted: its counters start again from zero
            requests = totals.get("requests", 0.0) - before.get("requests", 0.0)
            seconds = totals.get("latency_s_total", 0.0) - before.get("latency_s_total", 0.0)
            self._last[name] = totals
            for key in ("requests", "rows", "batches"):
                metrics[f"{name}/{key}"] = totals.get(key, 0.0)
            # not <role>/failures: that is the per-row count, which the step merges in first
            metrics[f"{name}/call_failures"] = totals.get("failures", 0.0)
            metrics[f"{name}/latency_s"] = seconds / requests if requests else math.nan
        return metrics

    def shutdown(self) -> None:
        """Stop every server (the clients hold nothing)."""
        import ray

        for servers in self.servers.values():
            for server in servers:
                ray.kill(server, no_restart=True)
        self.servers = {}


def start_model_roles(
    *,
    config: GRPOConfig,
    topology: Topology,
    placement: Placement,
    runtime_env: dict[str, Any] | None = None,
) -> ModelRoles:
    """Start the servers of every placed model role on its bundles, and a client per role."""
    roles = ModelRoles(metrics_timeout_s=config.runtime.timeouts.engine_call_s)
    if not topology.model_roles():
        return roles
    from llmrl.scorers import ModelClient

    try:
        for name, spec in topology.model_roles().items():
            factory, settings = _scorer(name, spec, config)
            servers: list[Any] = []
            if not spec.remote:
                servers = _start_servers(name, factory, placement, config, runtime_env)
                roles.servers[name] = servers
            roles.clients[name] = ModelClient(
                role=name,
                servers=servers,
                factory=factory if spec.remote else None,
                timeout_s=settings.timeout_s,
                max_retries=settings.max_retries,
            )
            where = spec.url if spec.remote else f"{spec.engines} {spec.backend} engine(s)"
            logger.info("%s up: %s on %s", name, spec.model or spec.served_model, where)
    except BaseException:
        roles.shutdown()
        raise
    return roles


def _scorer(name: str, spec: ModelRoleSpec, config: GRPOConfig) -> tuple[Any, ModelCallSettings]:
    """The picklable factory of role ``name``'s scorer, and its call settings."""
    from llmrl.scorers import JudgeFactory, RewardModelFactory, ScoringPolicyFactory, TeacherFactory

    run_options: dict[str, Any] = {
        "seed": config.seed,
        "threads": config.runtime.torch_threads,
        "load_options": config.model.load_options,
    }
    if name == "teacher":
        # a served teacher is read with the student's tokenizer: distillation needs the same one
        tokenizer = config.model.spec if spec.remote else None
        policy = ScoringPolicyFactory.from_role(spec, tokenizer=tokenizer, **run_options)
        return TeacherFactory(policy=policy, student=config.model.spec), TEACHER_CALL
    if name == "judge":
        settings = config.rewards.judge
        assert settings is not None  # topology_problems: a judge in the topology is used
        policy = ScoringPolicyFactory.from_role(spec, **run_options)
        return JudgeFactory(policy=policy, settings=settings), settings
    rm_settings = config.rewards.reward_model
    assert rm_settings is not None
    return RewardModelFactory.from_role(spec, rm_settings, **run_options), rm_settings


def _start_servers(
    name: str,
    factory: Any,
    placement: Placement,
    config: GRPOConfig,
    runtime_env: dict[str, Any] | None,
) -> list[Any]:
    """Role ``name``'s servers, one on each engine's first bundle: a transformers server holds
    its bundle's CPUs (and GPU); a vLLM one also the GPU its engine runs on."""
    from llmrl.scorers import start_model_servers

    role = placement.specs.models[name]
    options = []
    for group in placement.models[name]:
        option = role.actor_options(group.scheduling_strategy(0))
        option["num_gpus"] = role.gpus + role.server_gpus
        if runtime_env:
            option["runtime_env"] = runtime_env
        options.append(option)
    rows = config.prompts_per_step * config.num_samples
    return start_model_servers(
        name,
        factory,
        actor_options=options,
        batch_rows=math.ceil(rows / len(options)),
        batching_timeout_s=config.runtime.batching_timeout_s,
        max_restarts=config.runtime.max_actor_restarts,
        max_task_retries=1,
    )
