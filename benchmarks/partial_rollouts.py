"""Async GRPO with and without partial rollouts, on skewed response lengths
(``python benchmarks/runtime.py --partial``).

Two contenders run :class:`llmrl.runtime.GRPORuntime` in async mode with the same
``max_staleness``, each in its own worker process, in alternation (one request of
``--steps-per-rep`` steps each, in turn):

- **async**: a batch is one engine call per env worker's share: it ends when its longest reply
  ends, and the push after a step waits for the batch being collected;
- **async partial** (``runtime.partial_rollouts: true``): each env worker keeps twice its share
  of prompts in flight, an engine call returns as soon as the groups a worker needs ended, and
  the replies still going carry over into the next batch, across the push.

The workload is the arithmetic prompts, up to ``--new-tokens`` tokens (512) per reply, sampled
by :func:`llmrl.models.tiny.ending_model` with ``--ending-layers`` (16) layers and ``--eos-prob``
0.01: EOS at 1% a token, so reply lengths are geometric (mean 99, median 69) with a long tail,
and a batch of 16 replies waits for its longest. Its decode steps cost about the same whatever
the number of rows in them, as on a GPU, where decoding is bound by memory and kernel launches
rather than arithmetic: the regime where a batch's long tail costs most. ``--eos-prob 0``
samples with ``--model`` (SmolLM2-135M-Instruct) instead, whose replies are skewed on their own
(not measured). Both contenders run with ``--max-staleness`` 5 (with partial rollouts: sampling
one batch ahead, four versions left for the replies carried over). The figures are the steady
state (steps 2..n of a request, medians over requests): wall seconds per step, steps per minute and
the trainer's idle time per step, the seconds it waits for a batch (``generation_seconds``)
plus those it waits for the push to reach the engines between two batches
(``weight_sync_seconds``), and the trained response tokens per second (a batch of partial
rollouts holds the groups that ended first, so its replies are shorter: steps per minute alone
would flatter it). Target: partial rollouts at least 1.2x the steps per minute.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness import (
    Contender,
    alternate,
    figure,
    measure,
    median_of,
    print_table,
    save_results,
    summarize,
    verdict,
)

TARGET = 1.2  # steps per minute, partial / without


def ending_model_folder(eos_prob: float, layers: int) -> str:
    """The ending model (SmolLM2's tokenizer) exported once under the benchmarks' work dir."""
    from harness import WORK_DIR

    from llmrl.models import load_tokenizer
    from llmrl.models.tiny import ending_model

    folder = WORK_DIR / "model" / f"ending-{eos_prob}-{layers}"
    if not (folder / "config.json").is_file():
        staging = folder.with_name(folder.name + ".tmp")
        tokenizer = load_tokenizer()
        ending_model(tokenizer, eos_prob, num_layers=layers).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(folder)
    return str(folder)


def compare(options: dict[str, Any], args: argparse.Namespace) -> None:
    """Run both contenders on ``options`` (the GRPO workload) and report (module docstring)."""
    runtime = {
        **options,
        "kind": "grpo_runtime",
        "mode": "async",
        "max_staleness": args.max_staleness,
        "threads": args.async_threads,
    }
    specs = [("async", runtime), ("async partial", {**runtime, "partial_rollouts": True})]
    contenders: list[Contender] = []
    try:
        for name, spec in specs:
            contenders.append(Contender(name, sys.executable, "llmrl_side.py", spec))
        results = alternate(contenders, reps=args.reps, warmup=0)
    finally:
        for contender in contenders:
            contender.close()
    rows, summary = [], {}
    for contender in contenders:
        runs = results[contender.name]
        step = median_of(runs, "step_seconds")
        idle = median_of(runs, "idle_seconds")
        tokens = median_of(runs, "tokens")
        summary[contender.name] = {"step": step, "idle": idle, "tokens_per_s": tokens / step}
        rows.append(
            [
                contender.name,
                f"{step:.2f}",
                f"{60 / step:.2f}",
                f"{idle:.2f}",
                f"{median_of(runs, 'phases.generation'):.2f}",
                f"{median_of(runs, 'phases.weight sync'):.2f}",
                f"{median_of(runs, 'training'):.2f}",
                f"{tokens:.0f}",
                f"{tokens / step:.0f}",
                f"{median_of(runs, 'staleness'):.2f}",
                f"{median_of(runs, 'resumed_rows'):.1f}",
            ]
        )
    print(
        f"\nasync GRPO on {options['model']}, {args.prompts} prompts x G={args.samples}, <= "
        f"{args.new_tokens} new tokens, max_staleness {args.max_staleness}, "
        f"{args.async_threads} torch thread(s) per engine and rank; {args.reps} requests of "
        f"{args.steps_per_rep} steps, step 1 of each the warm-up"
    )
    print_table(
        rows,
        [
            "contender",
            "step s",
            "steps/min",
            "trainer idle s",
            "wait batch",
            "wait push",
            "training",
            "tokens",
            "tokens/s",
            "staleness",
            "resumed rows",
        ],
    )
    for contender in contenders:
        values = [f"{r['step_seconds']:.2f}" for r in results[contender.name]]
        print(f"  {contender.name}: {', '.join(values)} s per step")
    base, partial = summary["async"]["step"], summary["async partial"]["step"]
    speedup = base / partial
    print(
        f"\npartial rollouts: {speedup:.3f}x the steps per minute of async without  "
        f"{verdict(speedup, TARGET, higher_is_better=True)}"
    )
    throughput = summary["async partial"]["tokens_per_s"] / summary["async"]["tokens_per_s"]
    print(
        f"trained response tokens per second: {throughput:.3f}x (a batch of partial rollouts "
        "holds the groups that ended first, so its replies are shorter on average: the long "
        "ones come in later batches, or are refused when they outlive max_staleness)"
    )
    model = f"ending model, EOS {args.eos_prob}" if args.eos_prob else args.model
    workload = (
        f"{model}, {args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens"
    )
    save_results(
        "runtime_partial",
        [
            figure(
                f"partial rollouts: steps per minute against async without, {workload}",
                measure(60 / partial, "steps/min", f"{60 / partial:.2f} steps/min"),
                speedup,
                TARGET,
                higher_is_better=True,
                peer=("async", measure(60 / base, "steps/min", f"{60 / base:.2f} steps/min")),
                ratio_text=f"{speedup:.3f}x",
                target_text=f">= {TARGET}x",
            )
        ],
        {
            c.name: summarize(
                c,
                results[c.name],
                step_seconds=summary[c.name]["step"],
                idle_seconds=summary[c.name]["idle"],
                tokens_per_second=summary[c.name]["tokens_per_s"],
            )
            for c in contenders
        },
        extra={"steps_per_rep": args.steps_per_rep, "tokens_per_second_ratio": throughput},
        args=args,
        script="runtime.py --partial",
    )
