"""Weight push to a Ray inference actor: torch tensors vs the packed numpy form.

The GRPO runtime pushes the trainer's state dict to the inference actors after every step
through Ray's object store. Pickled as torch tensors, every tensor is copied into a byte string
by ``torch.save`` and parsed back in the actor; as a
:class:`~llmrl.transports.packed_weights.PackedStateDict` the arrays are written into shared
memory once and read in place (and a tied embedding is sent once). Both forms are pushed
alternately into the same actor (put + the actor's ``load_state_dict``), SmolLM2-135M in
float32; the ratio is packed / tensors (lower is better).

    python benchmarks/weight_push.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from harness import figure, measure, peak_rss_mb, print_table, save_results

from llmrl.models import load_model
from llmrl.transports.packed_weights import PackedStateDict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="llmrl-ray-"))
    import ray

    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)

    @ray.remote
    class Receiver:
        def __init__(self, model: str) -> None:
            self.model = load_model(model)

        def load(self, state: object) -> None:
            if isinstance(state, PackedStateDict):
                state = state.unpack()
            with torch.no_grad():
                self.model.load_state_dict(state)

    receiver = Receiver.remote(args.model)
    ray.get(receiver.__ray_ready__.remote())
    model = load_model(args.model)
    seconds: dict[str, list[float]] = {"tensors": [], "packed": []}
    sizes: dict[str, int] = {}
    for _ in range(args.reps + 1):  # the first round warms the object store up; not counted
        for kind in seconds:
            tick = time.perf_counter()
            state = {name: t.detach().cpu() for name, t in model.state_dict().items()}
            sent = PackedStateDict.pack(state) if kind == "packed" else state
            sizes[kind] = (
                sent.nbytes
                if isinstance(sent, PackedStateDict)
                else sum(t.numel() * t.element_size() for t in state.values())
            )
            ref = ray.put(sent)
            ray.get(receiver.load.remote(ref))
            seconds[kind].append(time.perf_counter() - tick)
            del ref
    ray.shutdown()
    medians = {kind: statistics.median(values[1:]) for kind, values in seconds.items()}
    print_table(
        [[kind, f"{medians[kind]:.2f}", f"{sizes[kind] / 1e6:.0f}"] for kind in seconds],
        ["form", "push seconds (median)", "MB"],
    )
    ratio = medians["packed"] / medians["tensors"]
    print(f"packed / tensors: {ratio:.3f}x")

    def pushed(kind: str) -> dict:
        return measure(medians[kind], "s", f"{medians[kind]:.2f} s")

    save_results(
        "weight_push",
        [
            figure(
                f"one weight push into a Ray actor (put + `load_state_dict`), {args.model} fp32",
                pushed("packed"),
                ratio,
                None,
                higher_is_better=False,
                peer=("torch tensors (before)", pushed("tensors")),
                ratio_text=f"{ratio:.3f}x",
            )
        ],
        {
            kind: {
                "info": {"form": "PackedStateDict" if kind == "packed" else "torch tensors"},
                "reps": args.reps,
                "medians": {"seconds": medians[kind], "mb": sizes[kind] / 1e6},
                "peak_rss_mb": None,  # both forms run in the driver: see extra
                "peak_rss_children_mb": None,
            }
            for kind in seconds
        },
        args=args,
        extra={
            "ray": ray.__version__,
            "driver_peak_rss_mb": peak_rss_mb(),
        },
    )


if __name__ == "__main__":
    main()
