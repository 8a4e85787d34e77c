"""The evaluation stage: greedy accuracy and pass@k of a model on a held-out split.

Problems are asked exactly as during training (the task's instructions as system prompt, via a
:class:`TaskEnv`), answers are scored by the task's parser, and every row's result is written to
``results.jsonl`` (``id``, ``prompt``, ``answer``, ``kind``, ``correct``, ``response``) next to a
``summary.json`` (the :class:`EvalReport`).

Each problem's *kind* is what its task calls it (:func:`~llmrl.eval.kinds.problem_kind`: the
arithmetic task's operators, ``"+"`` or ``"+*"``; None for tasks without kinds; a task with
several groupings gives each row a ``kinds`` list instead, the math task's
``["level:Level 3", "type:Algebra"]``, :func:`~llmrl.eval.kinds.problem_kinds`); the report
holds the greedy accuracy per kind, logged as ``accuracy_by_kind/<kind>`` metrics
(:func:`~llmrl.eval.kinds.kind_metric_name`: ``accuracy_by_kind/add`` for ``"+"``), and which
problem ids were answered correctly, so two evaluations on the same problems can be compared
pair by pair (:mod:`llmrl.eval.paired`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from llmrl.config.evaluate import EvalConfig
from llmrl.config.model_signals import RewardSettings
from llmrl.core.atomic_files import write_text_atomic
from llmrl.core.config_loading import ConfigError
from llmrl.data.non_tensor import as_list
from llmrl.data.prepare import load_prepared
from llmrl.data.problem import Problem
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.eval.kinds import accuracy_by_kind, kind_metrics, problem_kind, problem_kinds
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import LLMWrapperBase, TransformersWrapper, vLLMWrapper
from llmrl.policies.remote_vllm import RemoteVLLMEngine
from llmrl.stages.common import log_prepared_data, stage_tracker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

USER_TASK_TIMEOUT_S = RewardSettings().task_timeout_s
"""Seconds one score call of a task class from the user's code may take (GRPO's default); past
it the answer counts as wrong."""


@dataclass
class EvalReport:
    """What an evaluation found.

    ``accuracy_by_kind``: ``{kind: {"correct", "total", "accuracy"}}`` of the greedy answers
    (empty for a task without kinds); ``outcomes``: per problem id, whether its greedy answer was
    right (what a paired comparison of two evaluations needs).
    """

    label: str
    accuracy: float
    pass_at: dict[int, float] = field(default_factory=dict)
    num_problems: int = 0
    seconds: float = 0.0
    results_path: str = ""
    accuracy_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    outcomes: dict[str, bool] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        """The evaluation run's metrics: accuracy, time, pass@k, ``accuracy_by_kind/<kind>``."""
        metrics = {"accuracy": self.accuracy, "eval_seconds": self.seconds}
        metrics.update({f"pass_at_{k}": v for k, v in self.pass_at.items()})
        metrics.update(kind_metrics(self.accuracy_by_kind))
        return metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples, ``c`` of them correct: ``1 - C(n-c, k) / C(n, k)``."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def answer_all(
    env: TaskEnv, policy: LLMWrapperBase, samples: int, progress: bool, what: str
) -> dict[str, list[tuple[bool, str]]]:
    """Per problem id: (correct, response) of each of its ``samples`` answers.

    A multi-turn episode (tools, an environment's turns) is played to its end: the rows that
    are not done step again, and an answer is the episode's last reply and its verdict."""
    answers: dict[str, list[tuple[bool, str]]] = {}
    bar = tqdm(total=len(env.problems) * samples, desc=what, disable=not progress, unit="ans")
    while True:
        try:
            state = env.reset()
        except StopIteration:
            break
        while state.batch_size[0]:
            transition = env.step(policy(state))
            done = transition["done"].reshape(-1)
            responses = [str(r) for r in as_list(transition["text"].response)]
            for pid, correct, response, ended in zip(
                as_list(transition["prompt_id"]),
                transition["correct"].tolist(),
                responses,
                done.tolist(),
                strict=True,
            ):
                if ended:
                    answers.setdefault(pid, []).append((bool(correct), response))
            bar.update(int(done.sum()))
            state = transition["next"][~done]
    bar.close()
    return answers


def evaluate(config: EvalConfig) -> EvalReport:
    """Run the evaluation stage described by ``config``."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    task, manifest = prepared_task(config.data.path)
    _, problems = load_prepared(config.data.path)
    problems = problems[: config.data.max_eval_rows]
    if not problems:
        raise ConfigError([f"data.path: {config.data.path}: the eval split is empty"])
    tokenizer = load_tokenizer(config.model.spec, trust_remote_code=config.model.trust_remote_code)
    make_policy = _policy_factory(config, tokenizer)
    logger.info("Evaluating %s on %d %s problems", config.model.spec, len(problems), task.name)

    def env(repeats: int) -> TaskEnv:
        # a task class from the user's code: each score call bounded as in GRPO's env workers
        return TaskEnv(
            task,
            problems,
            config.batch_size,
            repeats,
            shuffle=False,
            epochs=1,
            timeout_s=USER_TASK_TIMEOUT_S,
        )

    greedy = make_policy({"max_new_tokens": config.max_new_tokens, "do_sample": False})
    with torch.no_grad():
        greedy_answers = answer_all(env(1), greedy, 1, config.progress, "eval greedy")
        sampled: dict[str, list[tuple[bool, str]]] = {}
        if config.num_samples:
            sampler = make_policy(config.sampling.as_kwargs(seed=config.seed))
            sampled = answer_all(
                env(config.num_samples), sampler, config.num_samples, config.progress, "eval pass@k"
            )
    seconds = time.perf_counter() - started
    report = _summarise(config, task, problems, greedy_answers, sampled, seconds)
    _log(config, report, manifest)
    return report


def _policy_factory(
    config: EvalConfig, tokenizer: PreTrainedTokenizerBase
) -> Callable[[dict[str, Any]], LLMWrapperBase]:
    """``make(generate_kwargs)``: policies over the model loaded here, or over the vLLM server at
    ``config.engine_url`` (the model is then served by another process, not loaded)."""
    if config.engine_url:
        engine = RemoteVLLMEngine(config.engine_url, model=config.engine_model)
        logger.info("Answers come from %r served at %s", engine.model, engine.url)
        return lambda kwargs: vLLMWrapper(engine, tokenizer, generate_kwargs=kwargs)
    model = load_model(
        config.model.spec,
        dtype=config.model.dtype,
        device=config.model.device,
        **config.model.load_options,
    )
    # every prompt starts with the same system prompt and chat header: prefilled once per batch
    return lambda kwargs: TransformersWrapper(
        model, tokenizer, generate_kwargs=kwargs, share_prompt_prefix=True
    )


def _summarise(
    config: EvalConfig,
    task: Task,
    problems: list[Problem],
    greedy: dict[str, list[tuple[bool, str]]],
    sampled: dict[str, list[tuple[bool, str]]],
    seconds: float,
) -> EvalReport:
    out_dir = Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for problem in problems:
        correct, response = greedy[problem.id][0]
        row = {"id": problem.id, "prompt": problem.prompt, "answer": problem.answer}
        row.update(kind=problem_kind(task, problem), correct=correct, response=response)
        if callable(getattr(task, "kinds", None)):  # several groupings (math: level and type)
            row["kinds"] = problem_kinds(task, problem)
        if sampled:
            row["sampled_correct"] = sum(c for c, _ in sampled[problem.id])
        rows.append(row)
    pass_at = {}
    if sampled:
        n = config.num_samples
        for k in config.pass_at:
            pass_at[k] = sum(pass_at_k(n, r["sampled_correct"], k) for r in rows) / len(rows)
    accuracy = sum(r["correct"] for r in rows) / len(rows)
    results = out_dir / "results.jsonl"
    write_text_atomic(results, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    report = EvalReport(
        config.label,
        accuracy,
        pass_at,
        len(rows),
        seconds,
        str(results),
        accuracy_by_kind=accuracy_by_kind((r.get("kinds", r["kind"]), r["correct"]) for r in rows),
        outcomes={r["id"]: r["correct"] for r in rows},
    )
    summary = {**report.__dict__, "pass_at": {str(k): v for k, v in pass_at.items()}}
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    logger.info(
        "%s: accuracy %.3f on %d problems (%.0f s)", config.label, accuracy, len(rows), seconds
    )
    if report.accuracy_by_kind:
        kinds = report.accuracy_by_kind.items()
        text = ", ".join(f"{kind} {c['correct']}/{c['total']}" for kind, c in kinds)
        logger.info("%s: correct per kind: %s", config.label, text)
    return report


def _log(config: EvalConfig, report: EvalReport, manifest: dict) -> None:
    with stage_tracker("eval", config) as tracker:
        tracker.log_params({"dataset.digest": manifest.get("digest"), "label": config.label})
        log_prepared_data(tracker, config.data.path, manifest, ("eval",))
        tracker.log_metrics(report.as_metrics(), step=0)
        rows = [json.loads(line) for line in Path(report.results_path).read_text().splitlines()]
        tracker.log_table(rows[:200], name=f"eval_{config.label}", step=0)
        tracker.log_artifact(report.results_path, "eval")
