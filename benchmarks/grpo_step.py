"""One full GRPO iteration: llmrl vs TRL's ``GRPOTrainer``, configured identically.

Both sides start from the same exported model and the same arithmetic prompts (8 by default),
sample G = 4 completions per prompt (at most 64 new tokens, temperature 1, no top-k/top-p),
score them with the same reward (llmrl's arithmetic scorer), compute group-relative advantages,
the clipped loss (beta = 0: no reference model; one update per batch, so no old-log-prob pass),
backward, clip the gradient norm to 1, take an AdamW step at the same learning rate, and make
the new weights the sampler's. Each contender is a worker process (TRL in the peers' venv); the
steps alternate between them after a warm-up step each. Printed: median step time, where it
goes (generation / loss forward / backward / optimizer / other), and the ratio.

TRL runs with its defaults for everything not named above; its default turns gradient
checkpointing on, which trades backward time for memory. ``--trl-variants`` then runs a second
pair, llmrl against TRL with gradient checkpointing off (the same compute as llmrl's step), after
the first pair has exited: only two training processes are resident at a time. Each side's peak
resident memory is printed beside its time.

**Packed against padded** (``--only packing``, or part of the default run): llmrl with
``model.packing`` on and off, side by side, on two workloads:

- the skewed-lengths training phase (``benchmarks/skewed.py``: 4 prompts x G = 4, three in four
  responses short, one in four at the ``--skewed-budget``): loss forward, backward and AdamW on
  the same built batch, with the share of the scoring forward's positions that are padding;
- the GRPO step above (sampling included), on what the model samples.

Target: where padding is at least 40% of the padded batch, the packed training phase takes at
most 0.7x the padded one's time.

    python benchmarks/grpo_step.py
    python benchmarks/grpo_step.py --reps 3 --trl-variants
    python benchmarks/grpo_step.py --only packing
"""

from __future__ import annotations

import argparse
import sys

from harness import (
    Contender,
    alternate,
    figure,
    max_of,
    measure,
    median_of,
    print_table,
    save_results,
    summarize,
    verdict,
)
from peers import peers_python
from workload import grpo_arguments, grpo_options

TARGET = 0.5  # llmrl step time / TRL step time, TRL with its defaults
TARGET_NO_GC = 0.6  # the same against TRL with gradient checkpointing off
TARGET_PACKED = 0.7  # packed training phase / padded, where padding is >= 40% of the batch
PHASES = ("generation", "loss forward", "backward", "optimizer", "weight sync", "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=8, new_tokens=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--trl-variants", action="store_true", help="also TRL without gradient checkpointing"
    )
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help="llmrl's micro_batch_size (rows per forward/backward, gradients accumulated into "
        "one step); default: the whole batch in one pass",
    )
    parser.add_argument(
        "--only", choices=("all", "trl", "packing"), default="all", help="which comparisons"
    )
    parser.add_argument(
        "--skewed-budget", type=int, default=256, help="the skewed workload's response budget"
    )
    parser.add_argument(
        "--skewed-prompts",
        type=int,
        default=4,
        help="the skewed workload's prompts (x G): two padded 8 x 4 x 256 trainers side by side "
        "outgrow 24 GiB",
    )
    args = parser.parse_args()

    options = grpo_options(args, rows=args.prompts)
    figures, summaries = [], {}
    if args.only in ("all", "trl"):
        trl_pairs(args, options, figures, summaries)
    if args.only in ("all", "packing"):
        packing_pairs(args, options, figures, summaries)
    # a packing-only run keeps its own file: the TRL comparison's stays as it was
    name = "grpo_step_packing" if args.only == "packing" else "grpo_step"
    save_results(name, figures, summaries, args=args, script="grpo_step.py")


def trl_pairs(args: argparse.Namespace, options: dict, figures: list, summaries: dict) -> None:
    """llmrl against TRL (and TRL without gradient checkpointing with ``--trl-variants``)."""
    peers = peers_python()
    # one pair at a time, so only two models train side by side (three did not fit in 24 GiB)
    pairs = [("TRL", {"gradient_checkpointing": True}, TARGET)]
    if args.trl_variants:
        pairs.append(("TRL (no grad ckpt)", {"gradient_checkpointing": False}, TARGET_NO_GC))
    for peer_name, peer_options, target in pairs:
        contenders = [
            Contender(
                "llmrl",
                sys.executable,
                "llmrl_side.py",
                {**options, "kind": "grpo_step", "micro_batch_size": args.micro_batch_size},
            ),
            Contender(peer_name, peers, "trl_side.py", {**options, **peer_options}),
        ]
        try:
            results = alternate(contenders, reps=args.reps)
        finally:
            for contender in contenders:
                contender.close()
        figures.append(report_pair(args, contenders, results, target))
        for contender in contenders:  # llmrl's entry: that of its last pair
            summaries[contender.name] = summarize(
                contender,
                results[contender.name],
                **{p: median_of(results[contender.name], "phases." + p) for p in PHASES},
            )


def packing_pairs(args: argparse.Namespace, options: dict, figures: list, summaries: dict) -> None:
    """llmrl packed against llmrl padded: the skewed training phase, then the GRPO step."""
    skewed = {
        **options,
        "kind": "skewed_training",
        "new_tokens": args.skewed_budget,
        "prompts": args.skewed_prompts,
    }
    step = {**options, "kind": "grpo_step", "micro_batch_size": args.micro_batch_size}
    for workload, worker_options, key in (("skewed", skewed, "training"), ("step", step, None)):
        contenders = [
            Contender(f"llmrl {name} ({workload})", sys.executable, "llmrl_side.py", opts)
            for name, opts in (
                ("packed", {**worker_options, "packing": True}),
                ("padded", {**worker_options, "packing": False}),
            )
        ]
        try:
            results = alternate(contenders, reps=args.reps)
        finally:
            for contender in contenders:
                contender.close()
        figures.append(report_packing(args, workload, contenders, results, key))
        for contender in contenders:
            summaries[contender.name] = summarize(
                contender,
                results[contender.name],
                training=median_of(results[contender.name], key or "training"),
                padding_share=contender.info.get("padding_share"),
            )


def report_packing(
    args: argparse.Namespace,
    workload: str,
    contenders: list[Contender],
    results: dict,
    key: str | None,
) -> dict:
    """Print one packed/padded pair (step or training time, peak memory, padding) and return
    its figure: the training phase's ratio on the skewed workload, the step's on the other."""
    packed, padded = contenders
    if workload == "skewed":
        print(
            f"\nPacked vs padded, training phase: {args.skewed_prompts} prompts x "
            f"G={args.samples}, "
            f"responses of at most {args.skewed_budget} tokens (3 in 4 short, 1 in 4 at the "
            f"budget), fp32, CPU, {packed.info['torch_threads']} threads, median of {args.reps}"
        )
    else:
        print(f"\nPacked vs padded, GRPO step (as above), median of {args.reps}")
    rows = []
    for contender in contenders:
        runs = results[contender.name]
        share = contender.info.get("padding_share")
        rows.append(
            [
                contender.name,
                f"{median_of(runs, 'seconds'):.2f}",
                f"{median_of(runs, key or 'training'):.2f}",
                f"{max_of(runs):.0f}",
                "-" if share is None else f"{share:.0%}",
            ]
        )
    print_table(rows, ["contender", "step s", "training s", "peak RSS MB", "padding"])
    measured = key or "seconds"
    ours, theirs = (median_of(results[c.name], measured) for c in contenders)
    ratio = ours / theirs
    share = padded.info.get("padding_share")
    target = TARGET_PACKED if share is not None and share >= 0.4 else None
    line = f"ratio packed / padded ({'training phase' if key else 'step'}): {ratio:.3f}"
    print(line + (f"  {verdict(ratio, target, higher_is_better=False)}" if target else ""))
    return figure(
        f"packed vs padded {'training phase, skewed lengths' if key else 'GRPO step'}, "
        f"{args.skewed_prompts if key else args.prompts} prompts x G={args.samples}"
        + (f", padding {share:.0%} of the padded batch" if share is not None else ""),
        measure(ours, "s"),
        ratio,
        target,
        higher_is_better=False,
        peer=("llmrl padded", measure(theirs, "s")),
    )


def report_pair(
    args: argparse.Namespace, contenders: list[Contender], results: dict, target: float
) -> dict:
    """Print one pair's table (step time, peak memory, phases) and ratio; return its figure."""
    llmrl, peer = contenders
    print(
        f"\nGRPO step: {args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens, "
        f"lr {args.lr}, fp32, CPU, {llmrl.info['torch_threads']} threads, "
        f"median of {args.reps} steps after 1 warm-up; TRL {peer.info['trl']}; llmrl "
        + (
            f"in micro-batches of {args.micro_batch_size} rows"
            if args.micro_batch_size
            else "in one pass over the batch"
        )
    )
    rows = []
    for contender in contenders:
        runs = results[contender.name]
        row = [contender.name, f"{median_of(runs, 'seconds'):.2f}", f"{max_of(runs):.0f}"]
        row += [f"{median_of(runs, 'phases.' + phase):.2f}" for phase in PHASES]
        rows.append(row)
    print_table(rows, ["contender", "step s", "peak RSS MB", *PHASES])
    ours, theirs = (median_of(results[c.name], "seconds") for c in contenders)
    ratio = ours / theirs
    print(
        f"ratio llmrl / {peer.name} (step time): {ratio:.3f}  "
        f"{verdict(ratio, target, higher_is_better=False)}"
    )
    ours_rss, theirs_rss = max_of(results[llmrl.name]), max_of(results[peer.name])
    print(f"peak resident memory: llmrl {ours_rss:.0f} MB, {peer.name} {theirs_rss:.0f} MB")
    return figure(
        f"one GRPO iteration, {args.prompts} prompts x G={args.samples}, "
        f"<= {args.new_tokens} new tokens, beta 0",
        measure(ours, "s", f"{ours:.1f} s ({ours_rss:.0f} MB peak)"),
        ratio,
        target,
        higher_is_better=False,
        peer=(
            peer.name.replace("TRL", "TRL `GRPOTrainer`", 1),
            measure(theirs, "s", f"{theirs:.1f} s ({theirs_rss:.0f} MB peak)"),
        ),
    )


if __name__ == "__main__":
    main()
