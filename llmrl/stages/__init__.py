"""The pipeline's stages: SFT, GRPO, evaluation (dataset preparation is
:func:`llmrl.data.prepare.prepare_dataset`), what they set up the same way, and the registry the
CLI and the flows run them through.

Layer 5 (stages and CLI): imports layers 0-4; only ``flows/`` sits above.

Each stage module is imported on use (:mod:`~llmrl.stages.sft`, :mod:`~llmrl.stages.grpo`,
:mod:`~llmrl.stages.evaluate`), so ``import llmrl.stages`` stays light;
:mod:`~llmrl.stages.registry` maps a command name to its config class and run function;
:mod:`~llmrl.stages.result_file` writes a stage's result where its launcher reads it.
"""
