"""What several sections of a :class:`~llmrl.topology.spec.Topology` share.

- :class:`SchedulingSpec`: the Kubernetes scheduling constraints of a role's pods;
- :class:`EngineSpec`: the fields of a section that runs engines (how many, their backend, how
  each is sharded, what each needs), which the inference engines
  (:class:`~llmrl.topology.spec.InferenceSpec`) and the model roles
  (:class:`~llmrl.topology.model_roles.ModelRoleSpec`) both are;
- :func:`with_rules`: a section's model config whose JSON schema carries the ``if``/``then``
  clauses of the rules about it (:mod:`llmrl.topology.rules`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

from pydantic import ConfigDict, Field

from llmrl.core.config_loading import MAX_CLUSTER, ConfigModel
from llmrl.topology.derived import ENGINE_GPUS
from llmrl.topology.rules import schema_clauses

Backend = Literal["vllm", "transformers"]


def with_rules(section: str | None) -> ConfigDict:
    """A model config whose JSON schema carries the ``if``/``then`` clauses of the rules about
    ``section`` (None: the rules across sections, on the Topology)."""

    def add_clauses(schema: dict[str, Any], model: type[ConfigModel]) -> None:
        clauses = schema_clauses(section, schema_defaults(section, model))
        if clauses:
            schema["allOf"] = clauses

    return ConfigDict(json_schema_extra=add_clauses)


def schema_defaults(section: str | None, model: type[ConfigModel]) -> Any:
    """What a left-out key means to the rules about ``section``, from the model whose schema
    carries them: its defaults under the section's name (every field of such a rule is in that
    section), or for the rules across sections the Topology's own ``schema_defaults``. The
    sections need not know the Topology they are parts of."""
    if section is None:
        return model.schema_defaults()
    return SimpleNamespace(**{section: model.model_construct()})


class SchedulingSpec(ConfigModel):
    """Kubernetes scheduling constraints of one role's pods, passed through unchanged.

    The keys inside ``tolerations`` and ``affinity`` are Kubernetes' own (camelCase), as in a
    pod spec.

    Example::

        SchedulingSpec(
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    """

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="the pods' nodeSelector (node label -> value)"
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="the pods' tolerations, as in a Kubernetes pod spec"
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="the pods' affinity, as in a Kubernetes pod spec"
    )


def scheduling_field() -> Any:
    """The ``scheduling`` field of a role's section."""
    return Field(
        default_factory=SchedulingSpec,
        description="node selector, tolerations and affinity of this role's pods",
    )


class EngineSpec(ConfigModel):
    """Engines of one kind: how many, how each is sharded, and what each one needs (the fields
    the rollout engines and the model roles share; see their classes)."""

    backend: Backend = Field(
        "vllm",
        description=(
            "'vllm' (GPU engines, one GPU per tensor-parallel rank) or 'transformers' (one "
            "process per engine on CPU or one GPU, for development clusters)"
        ),
    )
    engines: int = Field(
        1, ge=1, le=MAX_CLUSTER, description="number of independent inference engines"
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=MAX_CLUSTER,
        description="GPUs each vllm engine shards its model over (1 for transformers)",
    )
    gpus_per_engine: int | None = Field(
        None,
        ge=0,
        le=MAX_CLUSTER,
        description=(
            "GPUs each engine's pod requests; derived when left out (tensor_parallel_size for "
            "vllm, 0 for transformers) and must agree with the backend when given (0 or 1 for "
            "transformers)"
        ),
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="share of each GPU's memory vllm may take (lower it when colocated)",
    )
    cpus_per_engine: float = Field(
        4.0, gt=0, le=MAX_CLUSTER, description="CPU cores of each engine"
    )
    cpu_kv_cache_gb: float = Field(
        1.0,
        gt=0,
        le=1024,
        description=(
            "KV cache of each vllm engine on CPU (gpus_per_engine 0, vLLM's CPU build), in GiB; "
            "vLLM's own default takes most of the machine's memory"
        ),
    )
    enforce_eager: bool | None = Field(
        None,
        description=(
            "run vllm engines without torch.compile and CUDA graphs; null: eager on CPU "
            "(half the start-up time), compiled on GPUs"
        ),
    )
    memory_gb: float = Field(
        32.0, gt=0, le=MAX_CLUSTER, description="memory of each engine's pod, in GiB"
    )
    scheduling: SchedulingSpec = scheduling_field()

    @property
    def engine_gpus(self) -> int:
        """GPUs of each engine: ``gpus_per_engine``, or derived from the backend when unset."""
        return ENGINE_GPUS.expr.evaluate(self)
