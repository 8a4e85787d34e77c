"""Prefect orchestration of the llmrl stages: the pipeline flow and the stage launchers.

- :mod:`flows.pipeline`: the ``llmrl-pipeline`` flow (prepare -> SFT -> GRPO -> evaluation).
- :mod:`flows.launchers`: where a stage runs (a local subprocess, a Kubernetes Job or RayJob).
- ``python -m flows``: the whole pipeline locally, with a before/after table at the end.

Only orchestration lives here: no tensors, no torch; each stage is an ``llmrl`` command.
"""
