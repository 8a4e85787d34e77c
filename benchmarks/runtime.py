"""The GRPO runtime's own cost: one GRPO workload in one process, and through the runtime.

Three contenders run the same GRPO workload (the arithmetic prompts, G samples each, the same
lengths, loss and optimizer; 4 prompts x G=4, <= 32 new tokens by default), each in its own
worker process, in alternation (one request of ``--steps-per-rep`` steps each, in turn):

- **in-process**: :class:`inprocess.InProcessGRPO`, the per-rank algorithm
  (``GRPOTrainer.train``) with a sampler sharing the trained model in the same process;
- **runtime sync**: :class:`llmrl.runtime.GRPORuntime` on a local Ray with
  ``Topology.local_default()`` (1 transformers engine, 2 env workers, 1 trainer rank), on-policy;
- **runtime async**: the same runtime with ``mode: async`` (sampling one version ahead while the
  trainer trains, ``max_staleness`` 1).

Every step's wall time is measured (an async step's ``generation_seconds`` is only the wait for
a batch collected during the previous step, so only wall time counts its cost). The first step
of each request is its warm-up; the figure compared is the steady state, the mean wall time of
steps 2..n of a request (medians over requests), split into the phases the steps report.

A runtime request starts its own local Ray and runtime (start-up untimed, printed apart) and
stops them at its end: the runtime's rollouts collect ahead in a background thread, which would
otherwise run while the other contenders are timed, and two idle clusters (an engine and a
trainer rank with its optimizer each) beside the in-process model come close to the memory of a
24 GiB machine (Ray's memory monitor killed a trainer rank when other work ran beside them).

Targets: runtime overhead = (runtime sync step - in-process step) / runtime sync step <= 10%;
async throughput = sync step / async step (steps per second) >= 1.3x.

    python benchmarks/runtime.py
    python benchmarks/runtime.py --reps 5 --steps-per-rep 4 --async-threads 2
    python benchmarks/runtime.py --partial   # partial rollouts against async without

``--steps-per-rep`` must be at least 2 (the first step of a request is its warm-up).
"""

from __future__ import annotations

import argparse
import sys

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
from workload import grpo_arguments, grpo_options

OVERHEAD_TARGET = 0.10  # (runtime sync step - in-process step) / runtime sync step
ASYNC_TARGET = 1.3  # runtime sync step / runtime async step
PHASES = ("generation", "loss forward", "backward", "optimizer", "weight sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=4, new_tokens=None)
    parser.add_argument("--reps", type=int, default=3, help="timed requests per contender")
    parser.add_argument("--steps-per-rep", type=int, default=3, help="GRPO steps per request")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads of the sync runtime's actors"
    )
    parser.add_argument(
        "--async-threads",
        type=int,
        default=1,
        help="torch threads of the async runtime's engine and of its rank (they run at the same "
        "time: one core each on 2 cores)",
    )
    parser.add_argument("--max-staleness", type=int, default=None, help="default 1; --partial 5")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="instead: async with partial rollouts against async without, on skewed lengths "
        "(benchmarks/partial_rollouts.py; --new-tokens defaults to 512 there)",
    )
    parser.add_argument(
        "--eos-prob",
        type=float,
        default=0.01,
        help="--partial: sample with the ending model at this EOS rate (0: with --model)",
    )
    parser.add_argument("--ending-layers", type=int, default=16, help="--partial: its layers")
    args = parser.parse_args()
    if args.steps_per_rep < 2:
        parser.error("--steps-per-rep must be >= 2 (a request's first step is not steady state)")

    if args.partial:
        from partial_rollouts import compare, ending_model_folder

        args.max_staleness = 5 if args.max_staleness is None else args.max_staleness
        args.new_tokens = 512 if args.new_tokens is None else args.new_tokens
        # every train problem (each env worker keeps twice its share of prompts in flight)
        options = {**grpo_options(args, rows=None), "steps_per_rep": args.steps_per_rep}
        if args.eos_prob:
            options["model"] = ending_model_folder(args.eos_prob, args.ending_layers)
        compare({**options, "max_train_rows": None}, args)
        return
    args.max_staleness = 1 if args.max_staleness is None else args.max_staleness
    args.new_tokens = 32 if args.new_tokens is None else args.new_tokens
    options = {**grpo_options(args, rows=args.prompts), "steps_per_rep": args.steps_per_rep}
    runtime = {**options, "kind": "grpo_runtime", "max_staleness": args.max_staleness}
    specs = [
        ("in-process", {**options, "kind": "grpo_step"}),
        ("runtime sync", {**runtime, "mode": "sync", "threads": args.threads}),
        ("runtime async", {**runtime, "mode": "async", "threads": args.async_threads}),
    ]
    contenders: list[Contender] = []
    try:
        for name, spec in specs:
            contenders.append(Contender(name, sys.executable, "llmrl_side.py", spec))
        results = alternate(contenders, reps=args.reps, warmup=0)  # warm-up: each first step
    finally:
        for contender in contenders:
            contender.close()

    steps = args.steps_per_rep
    print(
        f"\nGRPO step: {args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens, "
        f"lr {args.lr}, fp32, CPU; {args.reps} requests of {steps} steps each, step 1 of each "
        f"the warm-up; in-process {contenders[0].info['torch_threads']} threads, runtime sync "
        f"{args.threads}, async {args.async_threads} threads per engine and rank"
    )
    print(f"runtime topology: {contenders[1].info['topology']}")
    print(
        "start-up per request (Ray + runtime, untimed, median): "
        + ", ".join(
            f"{c.name} {median_of(results[c.name], 'startup_seconds'):.1f} s"
            for c in contenders[1:]
        )
    )
    step: dict[str, float] = {}
    rows = []
    for contender in contenders:
        runs = results[contender.name]
        step[contender.name] = median_of(runs, "step_seconds")
        training = median_of(runs, "training")
        values = {phase: median_of(runs, "phases." + phase) for phase in PHASES}
        rank = values["loss forward"] + values["backward"] + values["optimizer"]
        other = step[contender.name] - values["generation"] - training - values["weight sync"]
        row = [contender.name, f"{step[contender.name]:.2f}", f"{1 / step[contender.name]:.3f}"]
        row += [f"{values['generation']:.2f}", f"{training:.2f}"]
        row += [f"{values[p]:.2f}" for p in ("loss forward", "backward", "optimizer")]
        row += [f"{training - rank:.2f}", f"{values['weight sync']:.2f}", f"{other:.2f}"]
        row += [f"{median_of(runs, 'tokens'):.0f}"]
        rows.append(row)
    print(
        f"seconds per step, steady state (mean of steps 2-{steps} of a request, median over "
        "requests):"
    )
    print_table(
        rows,
        [
            "contender",
            "step s",
            "steps/s",
            "generation",
            "training",
            "loss fwd",
            "backward",
            "optimizer",
            "train other",
            "weight sync",
            "other",
            "tokens",
        ],
    )
    print("per request (step s):")
    for contender in contenders:
        values = [f"{r['step_seconds']:.2f}" for r in results[contender.name]]
        print(f"  {contender.name}: {', '.join(values)}")
    staleness = median_of(results["runtime async"], "staleness")
    print(
        "generation: waiting for the batch (async: the part not overlapped with the previous "
        "step's training); training: advantage + the rank's train call, of which loss fwd, "
        "backward, optimizer and the rest (train other: batch transport to the rank, "
        "collectives; train other and other are differences of medians); async staleness "
        f"{staleness:.2f}"
    )
    overhead = (step["runtime sync"] - step["in-process"]) / step["runtime sync"]
    print(
        f"\nruntime overhead (runtime sync - in-process) / runtime sync: {overhead:.1%}  "
        f"{verdict(overhead, OVERHEAD_TARGET, higher_is_better=False)}"
    )
    speedup = step["runtime sync"] / step["runtime async"]
    print(
        f"async throughput (runtime sync step / runtime async step): {speedup:.3f}x  "
        f"{verdict(speedup, ASYNC_TARGET, higher_is_better=True)}"
    )

    def per_step(name: str) -> dict:
        return measure(step[name], "s/step", f"{step[name]:.2f} s/step")

    workload = f"{args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens"
    save_results(
        "runtime",
        [
            figure(
                f"runtime overhead: (runtime sync - in-process) / runtime sync step, {workload}",
                per_step("runtime sync"),
                overhead,
                OVERHEAD_TARGET,
                higher_is_better=False,
                peer=("in-process", per_step("in-process")),
                ratio_text=f"{overhead:.1%}",
                target_text=f"<= {OVERHEAD_TARGET:.0%}",
            ),
            figure(
                f"async throughput: runtime sync step / runtime async step, {workload}",
                per_step("runtime async"),
                speedup,
                ASYNC_TARGET,
                higher_is_better=True,
                peer=("runtime sync", per_step("runtime sync")),
                ratio_text=f"{speedup:.3f}x",
                target_text=f">= {ASYNC_TARGET}x",
            ),
        ],
        {
            c.name: summarize(
                c,
                results[c.name],
                step_seconds=step[c.name],
                training=median_of(results[c.name], "training"),
                startup_seconds=median_of(results[c.name], "startup_seconds"),
                **{p: median_of(results[c.name], "phases." + p) for p in PHASES},
            )
            for c in contenders
        },
        extra={"steps_per_rep": steps, "async_staleness": staleness},
        args=args,
    )


if __name__ == "__main__":
    main()
