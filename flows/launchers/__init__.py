"""Launchers run one ``llmrl`` stage command somewhere and return its summary.

- :class:`LocalLauncher`: a subprocess of this machine (``make run``, tests).
- :class:`KubernetesLauncher`: a KubeRay ``RayJob`` (sft, grpo) or a ``batch/v1`` Job (prepare,
  eval) on a cluster.

Both follow the :class:`Launcher` protocol and raise the same three errors, so a flow does not
know where its stages run. Both take the user's code as Ray's ``runtime_env``
(:class:`RayRuntimeEnv`, :mod:`flows.launchers.runtime_env`).
"""

from flows.launchers.base import (
    STAGE_COMMANDS,
    Launcher,
    StageConfigError,
    StageError,
    StageFailedError,
    StageResult,
    TransientStageError,
    stage_arguments,
)
from flows.launchers.kubernetes import KubernetesLauncher
from flows.launchers.local import LocalLauncher
from flows.launchers.runtime_env import RayRuntimeEnv
from flows.launchers.settings import KubernetesSettings, PodResources

__all__ = [
    "STAGE_COMMANDS",
    "KubernetesLauncher",
    "KubernetesSettings",
    "Launcher",
    "LocalLauncher",
    "PodResources",
    "RayRuntimeEnv",
    "StageConfigError",
    "StageError",
    "StageFailedError",
    "StageResult",
    "TransientStageError",
    "stage_arguments",
]
