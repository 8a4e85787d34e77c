"""What each env worker runs: its share of the task's prompts, as a :class:`TaskEnv`.

The driver ships a :class:`TaskEnvFactory` to every env worker actor
(:class:`~llmrl.collectors.EnvWorker`); worker ``i`` builds a
:class:`~llmrl.envs.task_env.TaskEnv` over rows ``i, i + n, i + 2n, ...`` of the train split
(disjoint shards), drawing ``prompts_per_worker`` prompts x ``num_samples`` responses per reset,
with group ids ``i, i + n, ...`` (unique across workers, as the advantage needs).
Rewards and tools run there, off the trainer: with the stage's ``tools`` on (see
:func:`tool_env_options`) episodes take several turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmrl.config.common import ToolSettings
from llmrl.config.model_signals import RewardSettings
from llmrl.envs.tasks.base import Task
from llmrl.topology import Placement


@dataclass(frozen=True, kw_only=True)
class TaskEnvFactory:
    """``factory(worker_index) -> TaskEnv`` over that worker's shard of ``rows`` (picklable);
    ``tools``: the stage's tool settings (None or all off: single-turn episodes); ``rewards``
    and ``scorers``: the task reward's weight and the model rewards (the clients of the judge
    and the reward model, :mod:`llmrl.runtime.model_roles`), scored after the task's."""

    task: Task
    rows: list[Any]
    num_workers: int
    prompts_per_worker: int
    num_samples: int
    seed: int
    tools: ToolSettings | None = None
    rewards: RewardSettings | None = None
    scorers: dict[str, Any] | None = None

    def __call__(self, worker_index: int) -> Any:
        from llmrl.envs.task_env import TaskEnv

        rewards = self.rewards or RewardSettings()

        return TaskEnv(
            self.task,
            self.rows[worker_index :: self.num_workers],
            batch_size=self.prompts_per_worker,
            repeats=self.num_samples,
            seed=self.seed + worker_index,
            group_ids=(worker_index, self.num_workers),  # unique across workers
            reward_weight=rewards.task_weight,
            fallback_reward=rewards.task_fallback_reward,
            timeout_s=rewards.task_timeout_s,
            reward_transforms=model_rewards(rewards, self.scorers or {}, self.tools),
            **tool_env_options(self.task, self.tools),
        )


def model_rewards(
    rewards: RewardSettings, scorers: dict[str, Any], tools: ToolSettings | None = None
) -> list[Any]:
    """A :class:`~llmrl.envs.transforms.ModelReward` per model reward ``rewards`` uses, over
    its scorer in ``scorers`` (by role name); with ``tools``, only an episode's final reply is
    scored."""
    max_turns = tools.max_turns if tools is not None and tools.enabled else None
    transforms = []
    for name, settings in rewards.models().items():
        from llmrl.envs.transforms import ModelReward

        if name not in scorers:
            raise ValueError(f"rewards.{name} is set but no {name} scorer was started")
        transforms.append(
            ModelReward(
                name,
                scorers[name],
                weight=settings.weight,
                normalize=getattr(settings, "normalize", False),
                fallback_reward=settings.fallback_reward,
                max_rows_per_request=settings.max_rows_per_request,
                max_turns=max_turns,
            )
        )
    return transforms


def env_worker_options(placement: Placement) -> list[dict[str, Any]]:
    """Ray options of each env worker: its bundle of the env workers' group, with the CPUs of
    the placement's :class:`~llmrl.topology.roles.EnvWorkerRole`; none without env workers."""
    spec, role = placement.specs.env_workers, placement.env_workers
    if spec is None or role is None:
        return []
    return [spec.actor_options(role.scheduling_strategy(i)) for i in range(spec.count)]


def tool_env_options(task: Task, tools: ToolSettings | None) -> dict[str, Any]:
    """The :class:`TaskEnv` options that give the model the enabled ``tools``: their transforms
    (before the task's reward), their instructions after the task's, and ``max_turns``; ``{}``
    when no tool is on.

    A multi-turn episode: the model writes a ```python block (``tools.python``) or a
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (``tools.mcp``: the MCP servers
    start here, in the env worker, and stop with the env or its process), the tool's output is
    appended as a ``tool`` message, and the model goes on, until a reply calls no tool (the
    answer) or ``tools.max_turns`` replies were given. Both tools may be on at once.
    """
    if tools is None or not tools.enabled:
        return {}
    transforms: list[Any] = []
    instructions = [task.instructions]
    if tools.python.enabled:
        from llmrl.envs.sandbox import SandboxLimits
        from llmrl.envs.transforms import PythonInterpreter

        python = tools.python
        limits = SandboxLimits(
            timeout_s=python.timeout_s,
            memory_mb=python.memory_mb,
            max_output_chars=python.max_output_chars,
            os_sandbox=python.os_sandbox,
        )
        transforms.append(PythonInterpreter(limits, max_blocks=python.max_blocks))
        instructions.append(PythonInterpreter.instructions)
    if tools.mcp.enabled:
        from llmrl.envs.transforms import MCPServerSpec, MCPToolTransform

        mcp = tools.mcp
        transform = MCPToolTransform(
            [MCPServerSpec(**server.model_dump()) for server in mcp.servers],
            max_calls=mcp.max_calls,
            max_output_chars=mcp.max_output_chars,
            start_timeout_s=mcp.start_timeout_s,
            max_restarts=mcp.max_restarts,
        )
        transforms.append(transform)
        instructions.append(transform.instructions)
    return {
        "system_prompt": "\n\n".join(instructions),
        "max_turns": tools.max_turns,
        "transforms": transforms,
    }
