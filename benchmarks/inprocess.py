"""The GRPO iteration in one process, as the benchmarks time it: the library's own.

The benchmarks' one-process contender is :class:`llmrl.runtime.grpo_loop.InProcessGRPO`: the GRPO
stage's parts (``TaskEnv`` + ``TransformersWrapper`` sampling, ``MCAdvantage`` through the
``DynamicSampler``, ``GRPOTrainer``'s per-rank loss and AdamW step, ``InProcessWeightUpdater``)
without Ray and without a second copy of the model, stepped by the runtime's own
:func:`llmrl.runtime.grpo_step.grpo_step`. ``benchmarks/runtime.py`` compares it with the
runtime's step on the same workload (the runtime's own cost); ``grpo_step.py``, ``overhead.py``
and ``learning.py`` time it against the peers; ``docs/grpo-loop.md`` shows a researcher's loop
over it.
"""

from __future__ import annotations

from llmrl.runtime.grpo_loop import InProcessGRPO, train_grpo

__all__ = ["InProcessGRPO", "train_grpo"]
