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

    python benchmarks/weight_push.py --reps 5 --engines 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from harness import figure, measure, peak_rss_mb, print_table, save_results

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--engines", type=int, default=2, help="inference actors pushed to")
    parser.add_argument("--bucket-mb", type=int, default=64)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
