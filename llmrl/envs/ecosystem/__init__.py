"""Adapters that turn environments from the ecosystem into llmrl tasks (layer: policies, envs,
objectives, as part of :mod:`llmrl.envs`).

Each adapter is a task class that :func:`llmrl.envs.tasks.make_task` finds by a short name, so a
prepared dataset, the GRPO env workers and the evaluation treat it like a built-in task: groups,
masks, log-probs and policy versions stay llmrl's. The third-party package each one wraps is an
optional extra, imported only when the adapter is used.
"""
