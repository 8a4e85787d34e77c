"""Does the pipeline learn? SFT then GRPO with the real SmolLM2-135M-Instruct on CPU, on the
generated arithmetic task, evaluated greedily on 40 held-out problems before and after.

Slow (a few minutes on 2 cores): ``pytest -m slow tests/train/test_learning.py -s`` prints the
accuracies, format rates and timings of each stage.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmrl.config import PrepareConfig
from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.config.sft import SFTConfig
from llmrl.data.prepare import prepare_dataset
from llmrl.envs.tasks import make_task
from llmrl.train.evaluate import evaluate
from llmrl.train.grpo import run_grpo
from llmrl.train.sft import run_sft
from tests.train.conftest import stage_config

pytestmark = [pytest.mark.slow, pytest.mark.learning]

MODEL = "smollm2-135m-instruct"
EVAL_PROBLEMS = 40
MAX_NEW_TOKENS = 48


def _format_rate(results_path: str, task) -> float:
    rows = [json.loads(line) for line in Path(results_path).read_text().splitlines()]
    return sum(task.score(r["response"], r["answer"]).formatted for r in rows) / len(rows)


def test_sft_then_grpo_raises_held_out_accuracy(mlflow_uri, tmp_path):
    timings: dict[str, float] = {}
    data = prepare_dataset(
        PrepareConfig(
            generate={"train_size": 200, "eval_size": EVAL_PROBLEMS}, output_dir=tmp_path / "data"
        ),
        progress=False,
    ).path
    task = make_task("arithmetic")
    common = [
        f"data.path={data}",
        f"tracking.tracking_uri={mlflow_uri}",
        "tracking.log_checkpoint_files=false",  # ~1.6 GB per SmolLM2 checkpoint
    ]

    def evaluate_model(label: str, *model: str) -> tuple[float, float]:
        tick = time.perf_counter()
        report = evaluate(
            stage_config(
                EvalConfig,
                *common,
                *model,
                f"data.max_eval_rows={EVAL_PROBLEMS}",
                output_dir=f"eval-{label}",
                batch_size=EVAL_PROBLEMS,
                max_new_tokens=MAX_NEW_TOKENS,
                label=label,
            )
        )
        timings[f"eval_{label}"] = time.perf_counter() - tick
        return report.accuracy, _format_rate(report.results_path, task)

    base = evaluate_model("base", f"model.name={MODEL}")

    tick = time.perf_counter()
    sft = run_sft(
        stage_config(
            SFTConfig,
            *common,
            f"model.name={MODEL}",
            "optimizer.lr=2e-5",
            "optimizer.warmup_steps=2",
            "checkpoint.every=12",
            "checkpoint.keep_last=1",
            "data.max_eval_rows=8",
            output_dir="sft",
            steps=12,  # the answer format is learned within ~5 steps
            batch_size=4,
            max_length=256,
            eval_every=12,
            eval_batches=1,
        )
    )
    timings["sft"] = time.perf_counter() - tick
    after_sft = evaluate_model("sft", f"model.checkpoint={sft.final_checkpoint}")

    tick = time.perf_counter()
    grpo = run_grpo(
        stage_config(
            GRPOConfig,
            *common,
            f"model.name={MODEL}",
            f"model.checkpoint={sft.final_checkpoint}",
            f"generation.max_new_tokens={MAX_NEW_TOKENS}",
            "optimizer.lr=2e-6",
            "checkpoint.every=4",
            "checkpoint.keep_last=1",
            output_dir="grpo",
            steps=4,
            prompts_per_step=4,
            num_samples=4,
        )
    )
    timings["grpo"] = time.perf_counter() - tick
    after_grpo = evaluate_model("grpo", f"model.checkpoint={grpo.final_checkpoint}")

    report = {
        "accuracy": {"base": base[0], "sft": after_sft[0], "grpo": after_grpo[0]},
        "format_rate": {"base": base[1], "sft": after_sft[1], "grpo": after_grpo[1]},
        "sft_loss": sft.train_loss,
        "sft_eval_loss": sft.eval_loss,
        "grpo_last_reward_mean": grpo.reward_mean,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
    }
    print("\nlearning check:", json.dumps(report, indent=2))

    # Reliable on this budget: the base model never finishes with '#### <number>' within 48
    # tokens (it explains at length), SFT teaches the format and the easy sums, and a few small
    # GRPO steps keep that. GRPO's own gain over SFT is within noise here and is not asserted.
    assert after_sft[1] >= base[1] + 0.5, report
    assert after_sft[0] >= base[0] + 0.1, report
    assert after_grpo[1] >= base[1] + 0.5, report
    assert after_grpo[0] >= base[0] + 0.1, report
    assert after_grpo[0] >= after_sft[0] - 0.1, report
