"""The topology's cross-field rules, written once as data.

Each :class:`Rule` says which field it is about, when it applies (``when``), what must then
hold (``require``) and the message when it does not. The same table is read three times:

- :func:`problems` checks a :class:`~llmrl.topology.spec.Topology` (its validator calls it);
- :func:`schema_clauses` writes the rules JSON Schema can state as ``if``/``then`` clauses of
  the model's JSON schema, hence of the chart's ``values.schema.json``;
- :mod:`deploy.chart_files` renders every rule into the chart's guard template
  (``helm/llmrl/templates/_topology_guard.tpl``), which fails ``helm install``/``template``
  with the same message, prefixed with ``topology.``.

Messages start with the dotted field they are about (``trainer.gpus: ...``), so
:func:`llmrl.core.config_loading.load_config` reports ``<file>: <field>: <message>``.

The inference engines and each model role (``teacher``, ``judge``, ``reward_model``: null
unless set) follow the same engine rules (:func:`_engine_rules`); a model role's rules start with
:class:`~llmrl.topology.optional.Present`, so they hold for a role left out, and they are the
same rows for each role, so one role's clauses, relative to its section, are the schema of
every :class:`~llmrl.topology.model_roles.ModelRoleSpec`.

Example:

>>> from llmrl.topology import Topology, TrainerSpec
>>> problems(Topology.model_construct(trainer=TrainerSpec(gpus=2)))
["trainer.gpus: strategy 'single' trains in one process on at most 1 GPU (got 2); use strategy
  'ddp' or 'fsdp' for more"]
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmrl.topology.derived import (
    ENGINE_GPUS,
    MODEL_ROLES,
    ROLE_ENGINE_GPUS,
    WORLD_SIZE,
    role_field,
)
from llmrl.topology.expressions import (
    Compare,
    Const,
    Expr,
    Field,
    In,
    IsNull,
    Mul,
    Not,
    NotInSchema,
    all_of,
    any_of,
)
from llmrl.topology.optional import Present

MULTI_GPU_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")
"""Training strategies that spread training over several ranks (need a world size >= 2)."""

BACKEND = Field("inference.backend", "str")
ENGINES = Field("inference.engines")
TENSOR_PARALLEL = Field("inference.tensor_parallel_size")
GPUS_PER_ENGINE = Field("inference.gpus_per_engine", nullable=True)
TRAINER_GPUS = Field("trainer.gpus")
RANKS = Field("trainer.ranks", nullable=True)
STRATEGY = Field("trainer.strategy", "str")
PLACEMENT = Field("reference.placement", "str")
REFERENCE_GPUS = Field("reference.gpus")
COLOCATED = Field("colocated", "bool")
TRANSPORT = Field("weight_transport", "str")


def _is(expr: Expr, value: Any) -> Compare:
    return Compare("==", expr, Const(value))


@dataclass(frozen=True)
class Rule:
    """``require`` must hold whenever ``when`` does; else ``field: message`` is the problem.

    ``message`` is a :meth:`str.format` template whose ``{names}`` are ``args``' values (ints
    or strings).
    """

    field: str
    when: Expr
    require: Expr
    message: str
    args: Mapping[str, Expr] = field(default_factory=dict)

    def broken(self, topology: Any) -> bool:
        """Whether the topology breaks the rule."""
        return bool(self.when.evaluate(topology)) and not self.require.evaluate(topology)

    def problem(self, topology: Any) -> str:
        """The message for the topology: ``<field>: <message>``."""
        values = {name: arg.evaluate(topology) for name, arg in self.args.items()}
        return f"{self.field}: {self.message.format(**values)}"

    def section(self) -> str | None:
        """The one section (``inference``, ...) every field of the rule is in, else None."""
        paths = {f.path for f in (*self.when.fields(), *self.require.fields())}
        sections = {path.split(".")[0] for path in paths if "." in path}
        if len(sections) == 1 and all("." in path for path in paths):
            return sections.pop()
        return None

    def placeholders(self) -> Iterator[tuple[str, str | None]]:
        """(literal text, arg name or None) pieces of the message, in order."""
        for literal, name, _, _ in string.Formatter().parse(self.message):
            yield literal, name


@dataclass(frozen=True)
class FirstOf:
    """Rules of which only the first broken one is reported: each later one is stated
    assuming the earlier ones hold (as a chain of ``if ... elif ...``)."""

    rules: tuple[Rule, ...]


def _needs_two_ranks(field_name: str, when: Expr, require: Expr) -> Rule:
    return Rule(
        field_name,
        all_of(In(STRATEGY, MULTI_GPU_STRATEGIES), when),
        require,
        "strategy '{strategy}' spreads training over several ranks and needs at least 2 (the "
        "trainer's world size is {world_size}); set trainer.gpus >= 2 (one rank per GPU), or "
        "trainer.gpus 0 and trainer.ranks >= 2 to train on CPU, or use strategy 'single'",
        {"strategy": STRATEGY, "world_size": WORLD_SIZE},
    )


@dataclass(frozen=True)
class _Engines:
    """The fields of a section of engines (``inference``, a model role) the rules read."""

    section: str
    backend: Expr
    tensor_parallel: Expr
    gpus_per_engine: Field
    gpus: Expr  # the derived GPUs of one engine


def _engine_rules(engines: _Engines, *applies: Expr) -> tuple[Rule, ...]:
    """The rules of every section of engines; ``applies``: when they apply at all (always when
    none is given)."""

    def on(backend: str) -> Expr:
        uses = _is(engines.backend, backend)
        return all_of(*applies, uses) if applies else uses

    section, size, gpus = engines.section, engines.tensor_parallel, engines.gpus
    return (
        Rule(
            f"{section}.tensor_parallel_size",
            on("transformers"),
            _is(size, 1),
            "the transformers backend runs each engine as one process and cannot shard it; "
            "must be 1 (got {size})",
            {"size": size},
        ),
        Rule(
            f"{section}.gpus_per_engine",
            on("transformers"),
            In(engines.gpus_per_engine, (0, 1, None)),  # left out: 0 for transformers
            "the transformers backend runs each engine on CPU or one GPU; must be 0 or 1 (got "
            "{gpus}); use backend 'vllm' to shard an engine over several GPUs",
            {"gpus": gpus},
        ),
        Rule(
            f"{section}.gpus_per_engine",
            on("vllm"),
            any_of(
                Compare("==", gpus, size),
                all_of(_is(gpus, 0), _is(size, 1)),  # vLLM's CPU build
            ),
            "a vllm engine uses one GPU per tensor-parallel rank; must equal "
            f"{section}.tensor_parallel_size ({{size}}), or be 0 with tensor_parallel_size 1 "
            "for vLLM's CPU build; got {gpus}",
            {"size": size, "gpus": gpus},
        ),
    )


_INFERENCE = _engine_rules(
    _Engines("inference", BACKEND, TENSOR_PARALLEL, GPUS_PER_ENGINE, ENGINE_GPUS)
)


def _model_role_rules(role: str) -> tuple[Rule, ...]:
    """The rules of the model role ``role`` when it is set: exactly one of ``model`` (engines of
    its own, placed as the inference engines are) and ``url`` (a served endpoint: nothing is
    placed, so no engines or GPUs are asked for)."""
    model = Field(f"{role}.model", "str", nullable=True)
    url = Field(f"{role}.url", "str", nullable=True)
    size = role_field(f"{role}.tensor_parallel_size")
    gpus = Field(f"{role}.gpus_per_engine", nullable=True)
    engines = role_field(f"{role}.engines")
    served, placed = all_of(Present(role), Not(IsNull(url))), all_of(Present(role), IsNull(url))
    remote = "a served endpoint (url) places no engines"
    return (
        Rule(
            f"{role}.model",
            placed,
            Not(IsNull(model)),
            "required unless url is set: the model the role runs on engines of its own (a "
            "model name, folder or GGUF file), or give url, the base URL of a served endpoint",
        ),
        Rule(
            f"{role}.model",
            served,
            IsNull(model),
            "set exactly one of model and url: with url the role calls that endpoint and runs "
            "no model of its own (name the served model with served_model)",
        ),
        Rule(
            f"{role}.served_model",
            placed,
            IsNull(Field(f"{role}.served_model", "str", nullable=True)),
            "names the model of a served endpoint; set url too, or leave it out when the role "
            "runs model on engines of its own",
        ),
        Rule(
            f"{role}.engines",
            served,
            _is(engines, 1),
            f"{remote}; must be 1 (got {{engines}}): scale the server behind the url instead",
            {"engines": engines},
        ),
        Rule(
            f"{role}.tensor_parallel_size",
            served,
            _is(size, 1),
            f"{remote}; must be 1 (got {{size}}): the server shards its model itself",
            {"size": size},
        ),
        Rule(
            f"{role}.gpus_per_engine",
            served,
            In(gpus, (0, None)),
            f"{remote}, so it gets no GPUs; must be 0 or left out (got {{gpus}})",
            {"gpus": gpus},
        ),
        *_engine_rules(
            _Engines(
                role, role_field(f"{role}.backend", "str"), size, gpus, ROLE_ENGINE_GPUS[role]
            ),
            placed,
        ),
    )


_TRAINER = FirstOf(
    (
        Rule(
            "trainer.ranks",
            all_of(Compare(">", TRAINER_GPUS, Const(0)), Not(IsNull(RANKS))),
            Compare("==", RANKS, TRAINER_GPUS),
            "each rank of a GPU trainer drives one GPU; must equal trainer.gpus ({gpus}) or be "
            "left out (got {ranks}); set trainer.gpus to 0 for CPU ranks",
            {"gpus": TRAINER_GPUS, "ranks": RANKS},
        ),
        Rule(
            "trainer.gpus",
            _is(STRATEGY, "single"),
            Compare("<=", TRAINER_GPUS, Const(1)),
            "strategy 'single' trains in one process on at most 1 GPU (got {gpus}); use "
            "strategy 'ddp' or 'fsdp' for more",
            {"gpus": TRAINER_GPUS},
        ),
        Rule(
            "trainer.ranks",
            _is(STRATEGY, "single"),
            In(RANKS, (1, None)),
            "strategy 'single' trains in one process; must be 1 or left out (got {ranks}); use "
            "strategy 'ddp' or 'fsdp' for several ranks",
            {"ranks": RANKS},
        ),
        _needs_two_ranks("trainer.gpus", IsNull(RANKS), Compare(">=", TRAINER_GPUS, Const(2))),
        _needs_two_ranks("trainer.ranks", Not(IsNull(RANKS)), Compare(">=", RANKS, Const(2))),
    )
)

_REFERENCE = (
    Rule(
        "reference.gpus",
        _is(PLACEMENT, "dedicated"),
        Compare(">=", REFERENCE_GPUS, Const(1)),
        "a dedicated reference model runs on its own GPUs; must be > 0 (got {gpus}), or use "
        "placement 'with_trainer'",
        {"gpus": REFERENCE_GPUS},
    ),
    Rule(
        "reference.gpus",
        Compare("!=", PLACEMENT, Const("dedicated")),
        _is(REFERENCE_GPUS, 0),
        "only a dedicated reference has GPUs of its own; must be 0 for placement '{placement}' "
        "(got {gpus})",
        {"placement": PLACEMENT, "gpus": REFERENCE_GPUS},
    ),
)

_COLOCATED_VLLM = all_of(_is(COLOCATED, True), _is(BACKEND, "vllm"))
_COLOCATION = (
    Rule(
        "colocated",
        _is(COLOCATED, True),
        _is(BACKEND, "vllm"),
        "inference and training share GPUs, which needs the vllm backend (inference.backend is "
        "'{backend}')",
        {"backend": BACKEND},
    ),
    Rule(
        "trainer.gpus",
        _COLOCATED_VLLM,
        Compare("==", TRAINER_GPUS, Mul(ENGINES, TENSOR_PARALLEL)),
        "colocated inference and training share the same GPUs, so it must equal "
        "inference.engines * inference.tensor_parallel_size ({engines} x {size} = {needed}), "
        "got {gpus}",
        {
            "engines": ENGINES,
            "size": TENSOR_PARALLEL,
            "needed": Mul(ENGINES, TENSOR_PARALLEL),
            "gpus": TRAINER_GPUS,
        },
    ),
    Rule(
        "inference.gpu_memory_utilization",
        _COLOCATED_VLLM,
        Compare("<", Field("inference.gpu_memory_utilization", "float"), Const(1.0)),
        "colocated engines share their GPUs with the trainer; must be < 1 to leave it memory "
        "(e.g. 0.4)",
    ),
)

_TRANSPORT = (
    Rule(
        "weight_transport",
        _is(TRANSPORT, "vllm"),
        _is(BACKEND, "vllm"),
        "'vllm' pushes straight into vllm engines; inference.backend is '{backend}' (use "
        "'object_store', 'broadcast' or 'auto')",
        {"backend": BACKEND},
    ),
    Rule(
        "weight_transport",
        _is(TRANSPORT, "broadcast"),
        _is(BACKEND, "transformers"),
        "'broadcast' sends to transformers engines; for inference.backend 'vllm' use 'vllm' "
        "(or 'object_store', 'auto')",
    ),
)

RULES: tuple[Rule | FirstOf, ...] = (
    *_INFERENCE,
    _TRAINER,
    *_REFERENCE,
    *_COLOCATION,
    *_TRANSPORT,
    *(rule for role in MODEL_ROLES for rule in _model_role_rules(role)),
)
"""Every cross-field rule of a topology, in the order their problems are reported."""


def all_rules() -> Iterator[Rule]:
    """Every rule, :class:`FirstOf` groups flattened, in order."""
    for entry in RULES:
        yield from entry.rules if isinstance(entry, FirstOf) else (entry,)


def problems(topology: Any) -> list[str]:
    """The messages of every rule the topology breaks (of a :class:`FirstOf`, the first)."""
    found = []
    for entry in RULES:
        for rule in entry.rules if isinstance(entry, FirstOf) else (entry,):
            if rule.broken(topology):
                found.append(rule.problem(topology))
                break
    return found


def schema_clauses(section: str | None, defaults: Any) -> list[dict[str, Any]]:
    """The ``if``/``then`` clauses of the rules JSON Schema can state, for one section's
    schema (``"inference"``, ...) or, with None, the topology's (rules across sections).

    ``defaults`` is the default Topology: a left-out key takes its value.
    """
    prefix = f"{section}." if section else ""
    clauses = []
    for rule in all_rules():
        if rule.section() != section:
            continue
        try:
            clause = {
                "if": rule.when.schema(defaults, prefix),
                "then": rule.require.schema(defaults, prefix),
            }
        except NotInSchema:
            continue  # the chart's guard template checks it
        clauses.append(clause)
    return clauses
