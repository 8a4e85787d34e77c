"""Environment transforms: prompts, tools, rewards and bookkeeping, one per module."""

from llmrl.envs.transforms.base import EnvTransform
from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer
from llmrl.envs.transforms.kl_reward import KLRewardTransform
from llmrl.envs.transforms.mcp_tools import MCPServerSpec, MCPToolError, MCPToolTransform
from llmrl.envs.transforms.model_reward import ModelReward
from llmrl.envs.transforms.policy_version import PolicyVersion
from llmrl.envs.transforms.python_interpreter import PythonInterpreter
from llmrl.envs.transforms.retrieve_log_prob import RetrieveLogProb
from llmrl.envs.transforms.task_reward import TaskReward
from llmrl.envs.transforms.thinking_prompt import AddThinkingPrompt

__all__ = [
    "AddThinkingPrompt",
    "DataLoadingPrimer",
    "EnvTransform",
    "KLRewardTransform",
    "MCPServerSpec",
    "MCPToolError",
    "MCPToolTransform",
    "ModelReward",
    "PolicyVersion",
    "PythonInterpreter",
    "RetrieveLogProb",
    "TaskReward",
]
