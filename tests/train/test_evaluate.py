"""The evaluation stage on a scripted case: a prepared dataset whose answers the test controls,
a scripted policy, and accuracy / pass@k / accuracy per problem kind checked against
hand-computed values.

Tolerance: the values are float64 ratios of counts (pass@k a product of a few of them), a few
ulps off the decimals written here; MLflow and the summary file keep the same float64. Approx's
default ``rel=1e-6`` is ample, while one miscounted sample moves a value by >= 0.02.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensordict import TensorDictBase

import llmrl.stages.evaluate as evaluate_module
from llmrl.config.evaluate import EvalConfig
from llmrl.data import ChatHistory, History
from llmrl.data.containers import Text
from llmrl.data.prepare import load_prepared
from llmrl.stages.evaluate import evaluate, pass_at_k
from tests.support.configs import stage_config
from tests.support.mlflow_runs import artifact_paths

# Problem i asks "What is i + i?" (answer 2i). The greedy policy gets problems 0, 1 and 2 right;
# the sampling policy gets CORRECT_SAMPLES[i] of its 5 answers to problem i right.
NUM_PROBLEMS = 5
GREEDY_CORRECT = {0, 1, 2}
CORRECT_SAMPLES = [5, 2, 0, 1, 3]
NUM_SAMPLES = 5


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 0.7
        (5, 2, 2, 0.7),
        (5, 1, 2, 0.4),  # 1 - C(4,2)/C(5,2) = 1 - 6/10
        (5, 3, 2, 0.9),  # 1 - C(2,2)/C(5,2) = 1 - 1/10
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (4, 1, 1, 0.25),  # pass@1 is the fraction correct
        (10, 3, 1, 0.3),
        (4, 2, 3, 1.0),  # fewer wrong answers than k: some pick is right
        (10, 1, 10, 1.0),
        (10, 2, 5, 1 - math.comb(8, 5) / math.comb(10, 5)),  # 1 - 56/252
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.fixture(scope="module")
def controlled_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared GSM8K-style dataset (from local JSONL files) with answers 2i."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("controlled")

    def write(name: str, indices: range) -> Path:
        rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
                for i in indices]  # fmt: skip
        path = root / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    config = PrepareConfig(
        task="gsm8k",
        source=str(write("train.jsonl", range(100, 102))),
        eval_source=str(write("eval.jsonl", range(NUM_PROBLEMS))),
        output_dir=root / "prepared",
    )
    return prepare_dataset(config, progress=False).path


class ScriptedPolicy:
    """Replies right or wrong by a rule on (problem index, sample index), in the output layout
    of a history-mode policy."""

    def __init__(self, greedy: bool) -> None:
        self.greedy = greedy
        self.calls = 0

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        self.calls += 1
        replies = [
            self.reply(question, sample)
            for question, sample in zip(
                [chat[-1]["content"] for chat in td.get(("history", "prompt")).to_chats()],
                td.get("sample_index").tolist(),
                strict=True,
            )
        ]
        prompt = td.get(("history", "prompt"))
        response = History.from_messages([{"role": "assistant", "content": r} for r in replies])
        out = td.clone(False)
        out.set("history", ChatHistory.from_histories(prompt, response))
        out.set("text", Text.from_strings(response=replies))
        return out

    def reply(self, question: str, sample: int) -> str:
        """The answer to "What is i + i?": right by the module's rules, else -1."""
        i = int(question.split()[2])
        right = i in GREEDY_CORRECT if self.greedy else sample < CORRECT_SAMPLES[i]
        return f"{i} + {i} = ...\n#### {2 * i if right else -1}"


class AdditionsOnlyPolicy(ScriptedPolicy):
    """Answers arithmetic problems ("What is a op b?") right when they are additions only."""

    def reply(self, question: str, sample: int) -> str:
        a, operator, b = question.removeprefix("What is ").removesuffix("?").split()
        return f"#### {int(a) + int(b) if operator == '+' else -999999}"


def _script(monkeypatch: pytest.MonkeyPatch, policy_cls: type) -> dict[str, ScriptedPolicy]:
    """Replace the evaluation's policies, greedy (do_sample=False) and sampling ones, with
    ``policy_cls``; returns them by kind once made."""
    made: dict[str, ScriptedPolicy] = {}

    def policy(model, tokenizer, generate_kwargs, **options):
        assert options == {"share_prompt_prefix": True}  # one system prompt for all problems
        greedy = generate_kwargs.get("do_sample") is False
        assert greedy or generate_kwargs["max_new_tokens"] == 16  # sampling settings passed
        return made.setdefault("greedy" if greedy else "sampled", policy_cls(greedy))

    monkeypatch.setattr(evaluate_module, "TransformersWrapper", policy)
    return made


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> dict[str, ScriptedPolicy]:
    """The evaluation's policies replaced by :class:`ScriptedPolicy`."""
    return _script(monkeypatch, ScriptedPolicy)


def test_evaluate_scripted_accuracy_pass_at_k_results_and_summary(
    controlled_data, tiny_model_dir, mlflow_uri, scripted
):
    config = stage_config(
        EvalConfig,
        f"data.path={controlled_data}",
        f"model.name={tiny_model_dir}",
        f"tracking.tracking_uri={mlflow_uri}",
        "sampling.max_new_tokens=16",
        output_dir="eval",
        batch_size=2,  # 5 problems: batches of 2, 2 and 1
        num_samples=NUM_SAMPLES,
        pass_at=[1, 2, 5],
        label="scripted",
    )
    report = evaluate(config)

    pass_at_1 = sum(c / NUM_SAMPLES for c in CORRECT_SAMPLES) / NUM_PROBLEMS  # 2.2 / 5
    pass_at_2 = (1 + 0.7 + 0 + 0.4 + 0.9) / NUM_PROBLEMS  # by hand, per problem
    pass_at_5 = 4 / NUM_PROBLEMS  # every problem with a right answer among its 5
    assert report.accuracy == pytest.approx(3 / 5)
    assert report.pass_at == pytest.approx({1: pass_at_1, 2: pass_at_2, 5: pass_at_5})
    assert report.pass_at[1] == pytest.approx(0.44) and report.pass_at[2] == pytest.approx(0.6)
    assert report.num_problems == NUM_PROBLEMS and report.label == "scripted"
    assert scripted["greedy"].calls == 3 and scripted["sampled"].calls == 3

    rows = [json.loads(line) for line in Path("eval/results.jsonl").read_text().splitlines()]
    assert report.results_path == str(Path("eval/results.jsonl"))
    assert [row["prompt"] for row in rows] == [f"What is {i} + {i}?" for i in range(NUM_PROBLEMS)]
    assert [row["answer"] for row in rows] == [str(2 * i) for i in range(NUM_PROBLEMS)]
    assert [row["correct"] for row in rows] == [i in GREEDY_CORRECT for i in range(NUM_PROBLEMS)]
    assert [row["sampled_correct"] for row in rows] == CORRECT_SAMPLES
    assert len({row["id"] for row in rows}) == NUM_PROBLEMS
    assert all(row["id"].startswith("gsm8k-eval-") for row in rows)
    assert rows[0]["response"].endswith("#### 0")
    assert rows[3]["response"].endswith("#### -1")
    assert all(row["kind"] is None for row in rows)  # GSM8K problems have no kind
    assert report.accuracy_by_kind == {}
    assert report.outcomes == {row["id"]: i in GREEDY_CORRECT for i, row in enumerate(rows)}

    summary = json.loads(Path("eval/summary.json").read_text())
    assert summary["label"] == "scripted"
    assert summary["accuracy"] == pytest.approx(0.6)
    assert summary["pass_at"] == pytest.approx({"1": 0.44, "2": 0.6, "5": 0.8})
    assert summary["num_problems"] == NUM_PROBLEMS
    assert summary["results_path"] == report.results_path and summary["seconds"] > 0
    assert summary["outcomes"] == report.outcomes and summary["accuracy_by_kind"] == {}

    client = MlflowClient(mlflow_uri)
    run = next(
        r
        for r in client.search_runs([client.get_experiment_by_name("llmrl").experiment_id])
        if r.data.params.get("label") == "scripted"
    )
    assert run.data.tags["llmrl.stage"] == "eval" and run.info.status == "FINISHED"
    assert run.data.metrics["accuracy"] == pytest.approx(0.6)
    assert run.data.metrics["pass_at_2"] == pytest.approx(0.6)
    assert run.data.params["num_samples"] == "5"
    assert not [key for key in run.data.metrics if key.startswith("accuracy_by_kind/")]
    artifacts = artifact_paths(mlflow_uri, run.info.run_id)
    assert "eval/results.jsonl" in artifacts
    assert "samples/eval_scripted_step000000.json" in artifacts


def test_evaluate_accuracy_by_kind_of_arithmetic_problems(
    arithmetic_data, tiny_model_dir, mlflow_uri, monkeypatch
):
    """Right on the additions only: accuracy 1 for kind "+", 0 for the others, in the rows,
    the summary and the eval run's metrics (``accuracy_by_kind/add``, ``/sub``, ``/mul``)."""
    _script(monkeypatch, AdditionsOnlyPolicy)
    config = stage_config(
        EvalConfig,
        f"data.path={arithmetic_data}",
        f"model.name={tiny_model_dir}",
        f"tracking.tracking_uri={mlflow_uri}",
        output_dir="eval",
        batch_size=4,
        label="by-kind",
    )
    report = evaluate(config)

    _, problems = load_prepared(arithmetic_data)
    kinds = {p.id: p.meta["operators"][0] for p in problems}  # two operands: one operator
    totals = {kind: list(kinds.values()).count(kind) for kind in sorted(set(kinds.values()))}
    assert set(totals) == {"+", "-", "*"}  # the 10 seeded problems mix all three
    expected = {
        kind: {"correct": n if kind == "+" else 0, "total": n, "accuracy": float(kind == "+")}
        for kind, n in totals.items()
    }
    assert report.accuracy_by_kind == expected
    assert report.accuracy == pytest.approx(totals.get("+", 0) / len(problems))
    assert report.outcomes == {pid: kind == "+" for pid, kind in kinds.items()}
    rows = [json.loads(line) for line in Path("eval/results.jsonl").read_text().splitlines()]
    assert {row["id"]: row["kind"] for row in rows} == kinds
    assert all(row["correct"] == (row["kind"] == "+") for row in rows)
    assert json.loads(Path("eval/summary.json").read_text())["accuracy_by_kind"] == expected

    client = MlflowClient(mlflow_uri)
    run = next(
        r
        for r in client.search_runs([client.get_experiment_by_name("llmrl").experiment_id])
        if r.data.params.get("label") == "by-kind"
    )
    names = {"+": "add", "-": "sub", "*": "mul"}
    by_kind = {k: v for k, v in run.data.metrics.items() if k.startswith("accuracy_by_kind/")}
    assert by_kind == {f"accuracy_by_kind/{names[k]}": float(k == "+") for k in totals}


def test_evaluate_greedy_only_and_max_eval_rows(controlled_data, tiny_model_dir, scripted):
    config = stage_config(
        EvalConfig,
        f"data.path={controlled_data}",
        f"model.name={tiny_model_dir}",
        "data.max_eval_rows=2",
        "tracking.enabled=false",
        output_dir="eval",
    )
    report = evaluate(config)

    assert report.accuracy == 1.0 and report.pass_at == {} and report.num_problems == 2
    assert "sampled" not in scripted
    rows = [json.loads(line) for line in Path("eval/results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("sampled_correct" not in row for row in rows)


def test_evaluate_the_tiny_model_for_real(arithmetic_data, tiny_model_dir):
    """No scripting: a random model answers (wrongly) and every file is written."""
    config = stage_config(
        EvalConfig,
        f"data.path={arithmetic_data}",
        f"model.name={tiny_model_dir}",
        "data.max_eval_rows=3",
        "tracking.enabled=false",
        output_dir="eval",
        max_new_tokens=4,  # the sampled answers too
        num_samples=2,
        pass_at=[1, 2],
    )
    report = evaluate(config)

    assert report.num_problems == 3 and 0.0 <= report.accuracy <= 1.0
    assert set(report.pass_at) == {1, 2}
    rows = [json.loads(line) for line in Path("eval/results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["sampled_correct"] in (0, 1, 2) for row in rows)
    assert all(isinstance(row["response"], str) for row in rows)


class GuessingPolicy(ScriptedPolicy):
    """Guesses 1 on every turn of the verifiers guessing game (tests/support/verifiers_tiny_env)."""

    def reply(self, question: str, sample: int) -> str:
        return "<answer>1</answer>"


def test_multi_turn_episodes_are_played_to_their_end():
    from llmrl.envs.task_env import TaskEnv
    from llmrl.envs.tasks import make_task

    task = make_task(
        "verifiers", env_id="tests.support.verifiers_tiny_env", env_args={"kind": "guess"}
    )
    problems = task.generate(6, seed=0, split="train")  # secrets n % 8 + 1: 1 among them
    env = TaskEnv(task, problems, batch_size=6, shuffle=False, epochs=1)
    policy = GuessingPolicy(greedy=True)
    answers = evaluate_module.answer_all(env, policy, 1, False, "eval")
    # one answer per problem: its episode's last reply, right only where the secret is 1
    assert sorted(answers) == sorted(p.id for p in problems)
    right = {p.id for p in problems if p.answer == "1"}
    assert right and right != set(answers)
    assert {pid for pid, [(correct, _)] in answers.items() if correct} == right
    assert policy.calls == 3  # the wrong guessers play all 3 turns (max_turns), then stop
