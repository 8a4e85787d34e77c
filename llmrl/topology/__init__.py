"""Cluster topology: the roles of a run, their resources, and their placement on Ray.

Layer 1 (data, models, topology, tracking): imports only llmrl.core.

:class:`Topology` is the single description of which GPUs, CPUs and memory the inference
engines, the trainer, the reference model, the environment workers and the model roles
(:class:`ModelRoleSpec`: a teacher, a judge, a reward model) get; :func:`role_specs`
derives each role's actors, pods and bundles from it, once. The Helm chart in ``helm/llmrl``
renders it into a KubeRay ``RayCluster``; :func:`place_on_ray` reserves it as Ray placement
groups (Ray is imported only when called).
"""

from llmrl.topology.model_roles import MODEL_ROLES, ModelRoleSpec
from llmrl.topology.placement import Placement, PlacementError, RoleGroup, place_on_ray
from llmrl.topology.roles import RoleSpecs, role_specs
from llmrl.topology.spec import (
    EnvWorkerSpec,
    InferenceSpec,
    ReferenceSpec,
    SchedulingSpec,
    Topology,
    TrainerSpec,
)

__all__ = [
    "MODEL_ROLES",
    "EnvWorkerSpec",
    "InferenceSpec",
    "ModelRoleSpec",
    "Placement",
    "PlacementError",
    "ReferenceSpec",
    "RoleGroup",
    "RoleSpecs",
    "SchedulingSpec",
    "Topology",
    "TrainerSpec",
    "place_on_ray",
    "role_specs",
]
