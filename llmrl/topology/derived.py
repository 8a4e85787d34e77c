"""The values the topology's rules derive from a section's fields, each defined once for Python
and the chart: the GPUs of one engine (of the inference engines and of each model role) and the
trainer's world size.

Each is a :class:`~llmrl.topology.expressions.Derived`: the section's Python property returns its
value, and the chart's guard template defines it as a named template the other templates
include (:mod:`deploy.chart_files`). A model role's section is null unless set and the
chart's values hold no defaults inside it: the fields of it these read are
:class:`~llmrl.topology.optional.FilledField` (Go reads a left-out key as its default).
"""

from __future__ import annotations

from llmrl.topology.expressions import Choose, Coalesce, Compare, Const, Derived, Field, Kind
from llmrl.topology.optional import FilledField

MODEL_ROLES: tuple[str, ...] = ("teacher", "judge", "reward_model")
"""The topology's optional model roles (:class:`~llmrl.topology.model_roles.ModelRoleSpec`)."""
MODEL_ROLE_DEFAULTS: dict[str, int | str] = {
    "backend": "vllm",
    "engines": 1,
    "tensor_parallel_size": 1,
}
"""ModelRoleSpec's defaults of the fields the rules read, which Go fills in (FilledField)."""


def _engine_gpus(backend: Field, tensor_parallel: Field) -> Coalesce:
    """GPUs of one engine of a section: ``gpus_per_engine``, or derived from its backend."""
    return Coalesce(
        Field("gpus_per_engine", nullable=True),
        Choose(Compare("==", backend, Const("vllm")), tensor_parallel, Const(0)),
    )


def role_field(path: str, kind: Kind = "int") -> FilledField:
    """A field of a model role (``judge.engines``) that Go reads as its default when left out."""
    return FilledField(path, kind, default=MODEL_ROLE_DEFAULTS[path.rsplit(".", 1)[-1]])


ENGINE_GPUS = Derived(
    "inference",
    "engine_gpus",
    "engineGpus",
    "GPUs of one inference engine: gpus_per_engine, or derived from the backend",
    _engine_gpus(Field("backend", "str"), Field("tensor_parallel_size")),
)
ROLE_ENGINE_GPUS: dict[str, Derived] = {
    role: Derived(
        role,
        "engine_gpus",
        role.split("_")[0] + "".join(part.title() for part in role.split("_")[1:]) + "EngineGpus",
        f"GPUs of one {role} engine: gpus_per_engine, or derived from the backend",
        _engine_gpus(role_field("backend", "str"), role_field("tensor_parallel_size")),
    )
    for role in MODEL_ROLES
}
"""Each model role's engine GPUs (its ``engine_gpus``), as :data:`ENGINE_GPUS` the engines'."""
WORLD_SIZE = Derived(
    "trainer",
    "world_size",
    "trainerWorldSize",
    "Trainer processes (torch.distributed ranks): ranks, else gpus, else 1",
    Coalesce(
        Field("ranks", nullable=True),
        Choose(Compare(">", Field("gpus"), Const(0)), Field("gpus"), Const(1)),
    ),
)
DERIVED: tuple[Derived, ...] = (ENGINE_GPUS, WORLD_SIZE, *ROLE_ENGINE_GPUS.values())
"""The derived values the rules read; the chart defines each as a named template."""
