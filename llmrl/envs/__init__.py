"""Environments: everything around the LLM (prompts, tools, rewards) and the tasks.

Layer 2 (policies, envs, objectives): imports layers 0-1.
"""

from llmrl.envs.chat_env import ChatEnv, queries
from llmrl.envs.dataset_env import DatasetChatEnv
from llmrl.envs.task_env import ArithmeticEnv, CountdownEnv, GSM8KEnv, IFEvalEnv, TaskEnv
from llmrl.envs.transforms import (
    AddThinkingPrompt,
    DataLoadingPrimer,
    EnvTransform,
    KLRewardTransform,
    PolicyVersion,
    PythonInterpreter,
    RetrieveLogProb,
    TaskReward,
)

__all__ = [
    "AddThinkingPrompt",
    "ArithmeticEnv",
    "ChatEnv",
    "CountdownEnv",
    "DataLoadingPrimer",
    "DatasetChatEnv",
    "EnvTransform",
    "GSM8KEnv",
    "IFEvalEnv",
    "KLRewardTransform",
    "PolicyVersion",
    "PythonInterpreter",
    "RetrieveLogProb",
    "TaskEnv",
    "TaskReward",
    "queries",
]
