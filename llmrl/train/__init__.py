"""The training stages: SFT, GRPO (sync and async), evaluation, and their checkpoints.

Each stage module is imported on use (``llmrl.train.sft``, ``llmrl.train.grpo``,
``llmrl.train.evaluate``), so ``import llmrl.train`` stays light.
"""
