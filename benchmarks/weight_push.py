"""Weight push, trainer -> engines: the Ray object store against the bucketed broadcast (gloo).

Every transport of :mod:`llmrl.transports` pushes the same SmolLM2-135M weights (float32,
538 MB) from this process into Ray inference actors that each hold a transformers engine
(:class:`~llmrl.runtime.engines.TransformersEngine`, as the GRPO runtime starts them), one run,
pushes alternating between transports:

- ``object store``: :class:`~llmrl.transports.RayObjectStoreWeightUpdater` (one ``ray.put`` of
  a ``PackedStateDict``, every actor reads it in place and loads it);
- ``broadcast``: :class:`~llmrl.transports.BroadcastWeightUpdater` over gloo (64 MB buckets in
  name order, each actor receives into a stream buffer, verifies, loads);
- ``in-process`` (the floor: no transfer, a ``load_state_dict`` into a second model here).

Each push is checksummed at the sender, verified by every receiver before loading, and each
engine reports the checksum of what it then holds (the script checks they all match). The
time of one checksum of the whole model is printed beside them. Ratios are against the object
store (lower is faster).

``--lora``: instead, a LoRA trainer (rank ``--lora-rank`` on q/k/v/o) pushing into a vLLM
engine of the stage environment (``.venv-stage``, vLLM's CPU build), side by side in two worker
processes (``workers/vllm_push_side.py``), pushes alternating: **merged** (the merged state dict
through ``VLLMEngine.load_weights``, the ``llmrl_file`` backend) against **adapter** (the
adapter's tensors alone through ``VLLMEngine.load_adapter``). Per push: seconds (median; the
trainer's side, building the state dict and its checksum, and the engine call), bytes, and the
ratios adapter / merged. After every push each engine's prompt log-probs of a probe are checked
against the trainer's (a push that did not arrive is an error, not a figure).

    python benchmarks/weight_push.py --reps 5 --engines 2
    python benchmarks/weight_push.py --lora --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import (
    Contender,
    alternate,
    figure,
    measure,
    median_of,
    peak_rss_mb,
    print_table,
    save_results,
    summarize,
)

from llmrl.core.weights_checksum import weights_checksum
from llmrl.models import load_model
from llmrl.runtime.engines import TransformersEngine
from llmrl.transports import (
    BroadcastWeightUpdater,
    InProcessWeightUpdater,
    RayObjectStoreWeightUpdater,
    WeightUpdater,
)

TRANSPORTS = ("object store", "broadcast", "in-process")
LORA_PUSHES = ("merged", "adapter")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PROBE_TOLERANCE = 1e-3
"""Largest gap between an engine's and the trainer's log-probs after a push: vLLM's CPU kernels
and torch differ by 3.8e-5 at most in fp32 on SmolLM2 (tests/vllm/conftest.py); a stale or
missing push moves them by tenths of a nat."""
STAGE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-stage" / "bin" / "python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--engines", type=int, default=2, help="inference actors pushed to")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--lora", action="store_true", help="instead: adapter against merged")
    parser.add_argument("--lora-rank", type=int, default=16, help="--lora: the adapters' rank")
    args = parser.parse_args()
    if args.lora:
        if not STAGE_PYTHON.exists():
            parser.error(f"{STAGE_PYTHON} is missing: --lora needs `make stage-env`")
        compare_lora(args)
        return
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="llmrl-ray-"))
    import ray

    from llmrl.collectors import InferenceActor

    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)
    engine = TransformersEngine(
        model=args.model, dtype="float32", device="cpu", generate_kwargs={}, batch_rows=1
    )
    actors = [
        ray.remote(InferenceActor)
        .options(num_cpus=0, max_concurrency=2)
        .remote(policy_factory=engine)
        for _ in range(args.engines)
    ]
    ray.get([actor.ready.remote() for actor in actors])
    trainer = load_model(args.model, dtype="float32")
    updaters: dict[str, WeightUpdater] = {
        "object store": RayObjectStoreWeightUpdater(actors),
        "broadcast": BroadcastWeightUpdater(
            actors, backend="gloo", bucket_bytes=args.bucket_mb << 20
        ),
        "in-process": InProcessWeightUpdater(load_model(args.model, dtype="float32")),
    }
    seconds: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    sizes: dict[str, int] = {}
    version = 0
    for rep in range(args.reps + 1):  # the first round warms up (and makes the gloo group)
        with torch.no_grad():  # new weights each round, as after an optimizer step
            for parameter in trainer.parameters():
                parameter.add_(1e-4)
        order = TRANSPORTS if rep % 2 == 0 else tuple(reversed(TRANSPORTS))
        for name in order:
            version += 1
            stats = updaters[name].push(trainer, version=version)
            expected = 1 if name == "in-process" else args.engines
            if stats.engine_checksums != (stats.checksum,) * expected:
                raise RuntimeError(f"{name}: an engine holds other weights than were sent")
            if rep:
                seconds[name].append(stats.seconds)
            sizes[name] = stats.bytes
    checksum_seconds = []
    for _ in range(3):
        tick = time.perf_counter()
        weights_checksum(trainer.state_dict())
        checksum_seconds.append(time.perf_counter() - tick)
    updaters["broadcast"].close()
    ray.shutdown()

    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base = medians["object store"]
    rows = [
        [name, f"{medians[name]:.2f}", f"{sizes[name] / 1e6:.0f}", f"{medians[name] / base:.3f}x"]
        for name in TRANSPORTS
    ]
    rows.append(["(one checksum of the model)", f"{min(checksum_seconds):.2f}", "", ""])
    print(
        f"{args.model} float32, {args.engines} engine(s), median of {args.reps} pushes each, "
        f"torch {torch.get_num_threads()} thread(s)"
    )
    print_table(rows, ["transport", "push seconds (median)", "MB sent", "/ object store"])
    ratios = {name: medians[name] / base for name in ("broadcast", "in-process")}
    print("; ".join(f"{name} / object store: {ratio:.3f}x" for name, ratio in ratios.items()))

    def pushed(name: str) -> dict:
        return measure(medians[name], "s", f"{medians[name]:.2f} s")

    what = f"one weight push into {args.engines} Ray engine(s), {args.model} fp32, checksummed"
    kinds = {
        "broadcast": "bucketed broadcast (gloo)",
        "in-process": "in-process load (no transfer)",
    }
    save_results(
        "weight_push",
        [
            figure(
                f"{what}: {kinds[name]} against the object store",
                pushed(name),
                ratio,
                None,
                higher_is_better=False,
                peer=("object store", pushed("object store")),
                ratio_text=f"{ratio:.3f}x",
            )
            for name, ratio in ratios.items()
        ],
        {
            name: {
                "info": {"transport": name},
                "reps": args.reps,
                "medians": {"seconds": medians[name], "mb": sizes[name] / 1e6},
                "peak_rss_mb": None,  # every transport runs in the driver: see extra
                "peak_rss_children_mb": None,
            }
            for name in TRANSPORTS
        },
        args=args,
        extra={
            "ray": ray.__version__,
            "checksum_seconds": min(checksum_seconds),
            "driver_peak_rss_mb": peak_rss_mb(),
        },
    )


def compare_lora(args: argparse.Namespace) -> None:
    """Merged against adapter pushes into vLLM engines, alternating (``--lora``)."""
    options = {
        "model": args.model,
        "r": args.lora_rank,
        "alpha": 2 * args.lora_rank,
        "targets": LORA_TARGETS,
    }
    contenders: list[Contender] = []
    try:
        for name in LORA_PUSHES:
            spec = {**options, "kind": name}
            contenders.append(Contender(name, STAGE_PYTHON, "vllm_push_side.py", spec))
        results = alternate(contenders, reps=args.reps)
    finally:
        for contender in contenders:
            contender.close()
    gaps = {name: max(r["probe_gap"] for r in runs) for name, runs in results.items()}
    if max(gaps.values()) > PROBE_TOLERANCE:
        raise RuntimeError(f"an engine does not serve what was pushed (log-prob gaps {gaps})")
    medians = {
        name: {
            key: median_of(runs, key)
            for key in ("push_seconds", "phases.prepare", "phases.engine", "bytes")
        }
        for name, runs in results.items()
    }
    ratios = {
        key: medians["adapter"][key] / medians["merged"][key] for key in ("push_seconds", "bytes")
    }
    print(
        f"\n{args.model} float32, LoRA rank {args.lora_rank} on {', '.join(LORA_TARGETS)}, one "
        f"vLLM engine (CPU build) per contender, median of {args.reps} pushes each"
    )
    print_table(
        [
            [
                name,
                f"{m['push_seconds']:.3f}",
                f"{m['phases.prepare']:.3f}",
                f"{m['phases.engine']:.3f}",
                f"{m['bytes'] / 1e6:.2f}",
                f"{gaps[name]:.1e}",
            ]
            for name, m in medians.items()
        ],
        ["push", "push seconds (median)", "prepare s", "engine s", "MB sent", "log-prob gap"],
    )
    seconds, sent = ratios["push_seconds"], ratios["bytes"]
    print(f"adapter / merged: {seconds:.3f}x the seconds, {sent:.4f}x the bytes")
    _save_lora(args, contenders, results, medians, ratios)


def _save_lora(
    args: argparse.Namespace,
    contenders: list[Contender],
    results: dict[str, list[dict[str, Any]]],
    medians: dict[str, dict[str, float]],
    ratios: dict[str, float],
) -> None:
    """``results/weight_push_lora.json``: the adapter / merged ratios of seconds and bytes."""
    what = (
        f"one weight push into a vLLM engine (CPU build), {args.model} fp32, "
        f"LoRA r={args.lora_rank} on q/k/v/o"
    )

    def value(name: str, key: str) -> dict:
        number = medians[name][key]
        if key == "push_seconds":
            return measure(number, "s", f"{number:.3f} s")
        return measure(number / 1e6, "MB", f"{number / 1e6:.2f} MB")

    figures = [
        figure(
            f"{what}: {label}, adapter alone against the merged model",
            value("adapter", key),
            ratios[key],
            None,
            higher_is_better=False,
            peer=("merged", value("merged", key)),
            ratio_text=f"{ratios[key]:.4f}x" if key == "bytes" else f"{ratios[key]:.3f}x",
        )
        for key, label in (("push_seconds", "seconds"), ("bytes", "bytes sent"))
    ]
    entries = {
        c.name: summarize(
            c,
            results[c.name],
            push_seconds=medians[c.name]["push_seconds"],
            prepare=medians[c.name]["phases.prepare"],
            engine=medians[c.name]["phases.engine"],
            mb=medians[c.name]["bytes"] / 1e6,
        )
        for c in contenders
    }
    save_results("weight_push_lora", figures, entries, args=args, script="weight_push.py --lora")


if __name__ == "__main__":
    main()
