"""One process of the concurrent-writers test (``tests/services``): an llmrl ``Tracker`` nested
under a parent run, as a stage process opens it. Once imported it creates ``<start>.ready-<n>``
and waits for the start file (so every writer begins at once); then it opens the run, logs its
params, ``--steps`` steps of metrics and a model version of one shared registered model, and
prints ``{"run_id", "version", "spooled"}`` as one JSON line.

    python -m tests.support.tracking_writer --uri URI --parent RUN_ID --writer 2 --steps 40 \\
        --start FILE --model-dir DIR --registered NAME --spool DIR

The metrics are functions of writer and step that the test recomputes: :func:`metrics_of`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

START_WAIT_S = 120.0


def metrics_of(writer: int, step: int) -> dict[str, float]:
    """What writer ``writer`` logs at ``step``: exact binary fractions, equal after a round trip."""
    return {"loss": writer + step / 64, "reward": step / 8 - writer, "tokens": float(step * 16)}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--uri", "--parent", "--start", "--model-dir", "--registered", "--spool"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()

    from llmrl.tracking import Tracker

    Path(f"{args.start}.ready-{args.writer}").touch()  # imported: ready to write at once
    deadline = time.monotonic() + START_WAIT_S
    while not Path(args.start).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"writer {args.writer}: no start file {args.start}")
        time.sleep(0.01)
    tracker = Tracker(
        f"writer-{args.writer}", experiment="concurrent", tracking_uri=args.uri,
        parent_run_id=args.parent, spool_dir=args.spool, log_system_metrics=False,
    )  # fmt: skip
    with tracker:
        tracker.log_params({"writer": args.writer, "optimizer": {"lr": 1e-5 * (args.writer + 1)}})
        for step in range(1, args.steps + 1):
            tracker.log_metrics(metrics_of(args.writer, step), step=step)
        version = tracker.log_model(args.model_dir, args.registered)
    print(json.dumps({"run_id": tracker.run_id, "version": version, "spooled": tracker.spooled}))


if __name__ == "__main__":
    main()
