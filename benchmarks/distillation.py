"""On-policy distillation on the 2-core machine: `make run`'s GRPO model teaches its SFT model.

After `make run` (its pipeline folder, default ``runs/pipeline``), this script:

1. runs ``llmrl grpo --config configs/opd.yaml`` with the SFT model as the student
   (``model.checkpoint``) and the GRPO model as the teacher (``topology.teacher.model``), both
   read from the pipeline's stage records;
2. evaluates the student before (the SFT model), the student after, and the teacher with
   ``configs/eval.yaml`` (greedy, the same held-out problems, 400 by default);
3. prints each gain over the student before with its paired 95% interval and the McNemar p,
   the distillation's wall time, and writes ``results/distillation.json``.

    python benchmarks/distillation.py                      # after `make run`
    python benchmarks/distillation.py --pipeline runs/pipeline --steps 48

Not a test: it takes the better part of 20 minutes (``docs/algorithms.md`` has its figures).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from harness import print_table, save_results

from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import load_config
from llmrl.eval.paired import paired_gain

REPO = Path(__file__).resolve().parents[1]


def stage_summary(pipeline: Path, stage: str) -> dict[str, Any]:
    """The newest finished ``stage`` record of the pipeline folder (``stages/<stage>-*.json``)."""
    records = sorted((pipeline / "stages").glob(f"{stage}-*.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        raise SystemExit(f"{pipeline}/stages: no {stage} record; run `make run` first")
    return json.loads(records[-1].read_text(encoding="utf-8"))


def prepared_data(pipeline: Path) -> Path:
    """The pipeline's prepared dataset folder (the one GRPO trained on)."""
    record = stage_summary(pipeline, "grpo")
    for override in record["overrides"]:
        if override.startswith("data.path="):
            return Path(override.removeprefix("data.path="))
    raise SystemExit(f"{pipeline}: the grpo record names no data.path")


def distil(student: str, teacher: str, data: Path, out: Path, steps: int | None) -> float:
    """Run the OPD stage; its wall time in seconds."""
    from llmrl.runtime.ray_cluster import ray_session
    from llmrl.stages.grpo import run_grpo

    overrides = [
        f"data.path={data}",
        f"model.checkpoint={student}",
        f"topology.teacher.model={teacher}",
        f"output_dir={out}",
        "tracking.enabled=false",
    ]
    if steps is not None:
        overrides.append(f"steps={steps}")
    config = load_config(GRPOConfig, REPO / "configs" / "opd.yaml", overrides)
    tick = time.perf_counter()
    with ray_session():
        result = run_grpo(config)
    print(f"distillation: {time.perf_counter() - tick:.0f} s, {result}", flush=True)
    return time.perf_counter() - tick


def final_model(out: Path) -> str:
    """The newest checkpoint's model folder under ``out``."""
    models = sorted((out / "checkpoints").glob("step-*/model"))
    if not models:
        raise SystemExit(f"{out}/checkpoints: the distillation saved no checkpoint")
    return str(models[-1])


def outcomes(model: str, data: Path, rows: int, out: Path) -> dict[str, bool]:
    """Per held-out problem id, whether ``model`` answered it right (``configs/eval.yaml``)."""
    from llmrl.stages.evaluate import evaluate

    config = load_config(
        EvalConfig,
        REPO / "configs" / "eval.yaml",
        [
            f"model.checkpoint={model}",
            f"data.path={data}",
            f"data.max_eval_rows={rows}",
            f"output_dir={out}",
            "tracking.enabled=false",
            "progress=false",
        ],
    )
    return evaluate(config).outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="runs/pipeline", help="make run's work folder")
    parser.add_argument("--eval-rows", type=int, default=400)
    parser.add_argument("--steps", type=int, help="override configs/opd.yaml's steps")
    parser.add_argument("--out", default="runs/distillation")
    args = parser.parse_args()

    pipeline, out = Path(args.pipeline).resolve(), Path(args.out).resolve()
    student = stage_summary(pipeline, "sft")["summary"]["final_checkpoint"]
    teacher = stage_summary(pipeline, "grpo")["summary"]["final_checkpoint"]
    data = prepared_data(pipeline)
    tick = time.perf_counter()
    seconds = distil(student, teacher, data, out / "opd", args.steps)
    after = final_model(out / "opd")
    answered = {
        name: outcomes(model, data, args.eval_rows, out / f"eval-{name}")
        for name, model in (("before", student), ("after", after), ("teacher", teacher))
    }
    total = time.perf_counter() - tick
    rows, gains = [], {}
    for name in ("after", "teacher"):
        gain = paired_gain(answered["before"], answered[name])
        gains[name] = gain.as_dict()
        rows.append(
            [
                f"student {name}" if name == "after" else "teacher (GRPO)",
                f"{gain.accuracy_after:.3f}",
                f"{gain.gain:+.3f} [{gain.ci_low:+.3f}, {gain.ci_high:+.3f}]",
                f"{gain.p_value:.3g}",
            ]
        )
    before_accuracy = sum(answered["before"].values()) / len(answered["before"])
    rows.insert(0, ["student before (SFT)", f"{before_accuracy:.3f}", "-", "-"])
    print_table(rows, ["model", "accuracy", "gain over before [95% paired]", "McNemar p"])
    print(f"distillation {seconds / 60:.1f} min; with the three evaluations {total / 60:.1f} min")
    save_results(
        "distillation",
        figures=[],
        contenders={},
        args=args,
        extra={
            "student": student,
            "teacher": teacher,
            "distillation_seconds": seconds,
            "total_seconds": total,
            "before_accuracy": before_accuracy,
            "gains": gains,
        },
    )


if __name__ == "__main__":
    main()
