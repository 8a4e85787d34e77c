"""llmrl: a TensorDict-based toolkit for LLM post-training (SFT, GRPO) and the platform around it.

The names a researcher's own loop uses are importable from here, as ``torchrl.envs.llm`` or
``trl`` export theirs::

    from llmrl import GRPOLoss, LLMCollector, MCAdvantage, TransformersWrapper

Each one lives in its own module (``_EXPORTS`` maps a name to it) and is imported on first
access (PEP 562), so ``import llmrl`` stays cheap and imports no torch: the Prefect flow image,
which has no torch, imports ``llmrl.config`` and ``llmrl.topology`` (and so this file). The API
reference is built from these names (``docs-api/``, ``make api-docs``); a loop written with
them: ``docs/grpo-loop-torchrl.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# What an IDE or a type checker sees (`X as X`: an explicit re-export); at run time each name is
# imported by __getattr__ below.
# tests/test_public_api.py keeps this block and _EXPORTS the same.
if TYPE_CHECKING:
    from llmrl.collectors.async_rollouts import AsyncRollouts as AsyncRollouts
    from llmrl.collectors.dynamic_sampling import DynamicSampler as DynamicSampler
    from llmrl.collectors.llm_collector import LLMCollector as LLMCollector
    from llmrl.collectors.ray_collector import RayLLMCollector as RayLLMCollector
    from llmrl.config.evaluate import EvalConfig as EvalConfig
    from llmrl.config.grpo import GRPOConfig as GRPOConfig
    from llmrl.config.prepare import PrepareConfig as PrepareConfig
    from llmrl.config.sft import SFTConfig as SFTConfig
    from llmrl.core.config_loading import load_config as load_config
    from llmrl.data.containers import ChatHistory as ChatHistory
    from llmrl.data.containers import LogProbs as LogProbs
    from llmrl.data.containers import Masks as Masks
    from llmrl.data.containers import Text as Text
    from llmrl.data.containers import Tokens as Tokens
    from llmrl.data.history import History as History
    from llmrl.data.prepare import prepare_dataset as prepare_dataset
    from llmrl.data.problem import Problem as Problem
    from llmrl.envs.chat_env import ChatEnv as ChatEnv
    from llmrl.envs.dataset_env import DatasetChatEnv as DatasetChatEnv
    from llmrl.envs.task_env import ArithmeticEnv as ArithmeticEnv
    from llmrl.envs.task_env import TaskEnv as TaskEnv
    from llmrl.envs.tasks import make_task as make_task
    from llmrl.envs.tasks.base import Score as Score
    from llmrl.envs.tasks.base import Task as Task
    from llmrl.envs.tasks.reward_function import RewardFunction as RewardFunction
    from llmrl.envs.tasks.reward_function import RewardFunctionTask as RewardFunctionTask
    from llmrl.envs.tasks.reward_function import batch_reward as batch_reward
    from llmrl.envs.tasks.reward_function import group_reward as group_reward
    from llmrl.envs.transforms.base import EnvTransform as EnvTransform
    from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer as DataLoadingPrimer
    from llmrl.envs.transforms.kl_reward import KLRewardTransform as KLRewardTransform
    from llmrl.envs.transforms.mcp_tools import MCPToolTransform as MCPToolTransform
    from llmrl.envs.transforms.policy_version import PolicyVersion as PolicyVersion
    from llmrl.envs.transforms.python_interpreter import PythonInterpreter as PythonInterpreter
    from llmrl.envs.transforms.retrieve_log_prob import RetrieveLogProb as RetrieveLogProb
    from llmrl.envs.transforms.task_reward import TaskReward as TaskReward
    from llmrl.envs.transforms.thinking_prompt import AddThinkingPrompt as AddThinkingPrompt
    from llmrl.models.loading import load_model as load_model
    from llmrl.models.loading import load_tokenizer as load_tokenizer
    from llmrl.models.tiny import tiny_model as tiny_model
    from llmrl.objectives.advantage_estimators import (
        ReinforcePlusPlusAdvantage as ReinforcePlusPlusAdvantage,
    )
    from llmrl.objectives.advantage_estimators import RLOOAdvantage as RLOOAdvantage
    from llmrl.objectives.advantages import MCAdvantage as MCAdvantage
    from llmrl.objectives.cispo import CISPOLoss as CISPOLoss
    from llmrl.objectives.grpo import GRPOLoss as GRPOLoss
    from llmrl.objectives.gspo import GSPOLoss as GSPOLoss
    from llmrl.objectives.sft import SFTLoss as SFTLoss
    from llmrl.policies.base import LLMWrapperBase as LLMWrapperBase
    from llmrl.policies.generation_kwargs import GenerationKwargs as GenerationKwargs
    from llmrl.policies.transformers_wrapper import TransformersWrapper as TransformersWrapper
    from llmrl.policies.vllm_wrapper import vLLMWrapper as vLLMWrapper
    from llmrl.runtime.grpo_loop import InProcessGRPO as InProcessGRPO
    from llmrl.runtime.grpo_loop import train_grpo as train_grpo
    from llmrl.topology.spec import Topology as Topology
    from llmrl.tracking.tracker import Tracker as Tracker
    from llmrl.train.grpo_trainer import GRPOTrainer as GRPOTrainer
    from llmrl.transports.in_process import InProcessWeightUpdater as InProcessWeightUpdater
    from llmrl.transports.weights import WeightSyncStats as WeightSyncStats
    from llmrl.transports.weights import WeightUpdater as WeightUpdater

_EXPORTS: dict[str, str] = {
    # the chat data model (llmrl.data)
    "History": "llmrl.data.history",
    "ChatHistory": "llmrl.data.containers",
    "Text": "llmrl.data.containers",
    "Tokens": "llmrl.data.containers",
    "Masks": "llmrl.data.containers",
    "LogProbs": "llmrl.data.containers",
    "Problem": "llmrl.data.problem",
    "prepare_dataset": "llmrl.data.prepare",
    # models and tokenizers (llmrl.models)
    "load_model": "llmrl.models.loading",
    "load_tokenizer": "llmrl.models.loading",
    "tiny_model": "llmrl.models.tiny",
    # policies: the LLM behind one TensorDict API (llmrl.policies)
    "LLMWrapperBase": "llmrl.policies.base",
    "TransformersWrapper": "llmrl.policies.transformers_wrapper",
    "vLLMWrapper": "llmrl.policies.vllm_wrapper",
    "GenerationKwargs": "llmrl.policies.generation_kwargs",
    # chat environments and their transforms (llmrl.envs)
    "ChatEnv": "llmrl.envs.chat_env",
    "DatasetChatEnv": "llmrl.envs.dataset_env",
    "TaskEnv": "llmrl.envs.task_env",
    "ArithmeticEnv": "llmrl.envs.task_env",
    "EnvTransform": "llmrl.envs.transforms.base",
    "DataLoadingPrimer": "llmrl.envs.transforms.data_loading_primer",
    "TaskReward": "llmrl.envs.transforms.task_reward",
    "KLRewardTransform": "llmrl.envs.transforms.kl_reward",
    "RetrieveLogProb": "llmrl.envs.transforms.retrieve_log_prob",
    "PolicyVersion": "llmrl.envs.transforms.policy_version",
    "PythonInterpreter": "llmrl.envs.transforms.python_interpreter",
    "MCPToolTransform": "llmrl.envs.transforms.mcp_tools",
    "AddThinkingPrompt": "llmrl.envs.transforms.thinking_prompt",
    # tasks and rewards (llmrl.envs.tasks)
    "make_task": "llmrl.envs.tasks",
    "Task": "llmrl.envs.tasks.base",
    "Score": "llmrl.envs.tasks.base",
    "RewardFunction": "llmrl.envs.tasks.reward_function",
    "RewardFunctionTask": "llmrl.envs.tasks.reward_function",
    "batch_reward": "llmrl.envs.tasks.reward_function",
    "group_reward": "llmrl.envs.tasks.reward_function",
    # losses and advantages (llmrl.objectives)
    "GRPOLoss": "llmrl.objectives.grpo",
    "GSPOLoss": "llmrl.objectives.gspo",
    "CISPOLoss": "llmrl.objectives.cispo",
    "SFTLoss": "llmrl.objectives.sft",
    "MCAdvantage": "llmrl.objectives.advantages",
    "RLOOAdvantage": "llmrl.objectives.advantage_estimators",
    "ReinforcePlusPlusAdvantage": "llmrl.objectives.advantage_estimators",
    # collectors (llmrl.collectors)
    "LLMCollector": "llmrl.collectors.llm_collector",
    "RayLLMCollector": "llmrl.collectors.ray_collector",
    "AsyncRollouts": "llmrl.collectors.async_rollouts",
    "DynamicSampler": "llmrl.collectors.dynamic_sampling",
    # weight sync (llmrl.transports)
    "WeightUpdater": "llmrl.transports.weights",
    "WeightSyncStats": "llmrl.transports.weights",
    "InProcessWeightUpdater": "llmrl.transports.in_process",
    # one rank's GRPO training (llmrl.train) and GRPO in one process (llmrl.runtime)
    "GRPOTrainer": "llmrl.train.grpo_trainer",
    "InProcessGRPO": "llmrl.runtime.grpo_loop",
    "train_grpo": "llmrl.runtime.grpo_loop",
    # stage configs (llmrl.config) and their YAML loading (llmrl.core)
    "GRPOConfig": "llmrl.config.grpo",
    "SFTConfig": "llmrl.config.sft",
    "EvalConfig": "llmrl.config.evaluate",
    "PrepareConfig": "llmrl.config.prepare",
    "load_config": "llmrl.core.config_loading",
    # the cluster topology (llmrl.topology) and MLflow tracking (llmrl.tracking)
    "Topology": "llmrl.topology.spec",
    "Tracker": "llmrl.tracking.tracker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first access and kept (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llmrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
