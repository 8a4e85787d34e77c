"""JudgeScorer: the judge's prompt, the verdict arithmetic and the parser, on a scripted judge
whose log-probs and answers the tests write; the tiny model's verdict log-probs against its own
forward (fast); the real SmolLM2 as judge on the transformers engine (slow; vLLM's CPU build:
tests/vllm/test_model_scorers.py)."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from llmrl.config.model_signals import JudgeSettings
from llmrl.policies import LLMWrapperBase, TransformersWrapper
from llmrl.policies.io_spec import GeneratedSample, ScoreResult
from llmrl.scorers.judge import (
    JudgeFactory,
    JudgeScorer,
    find_verdict,
    judge_message,
    verdict_score,
)
from llmrl.scorers.policy_factory import ScoringPolicyFactory
from tests.tolerances import log_prob_atol, max_abs

UNLIKELY = -30.0
"""The scripted judge's log-prob of any token its table leaves out."""


class ScriptedJudge(LLMWrapperBase):
    """A judge whose outputs the test writes, keyed by a marker in the judge's prompt (the
    first key of ``table`` / ``answers`` found in the decoded prompt): scoring gives each
    answer token ``table[marker][token id]`` (``UNLIKELY`` when absent), answering returns
    ``answers[marker]``. Every backend call is recorded (twins share the records)."""

    def __init__(self, tokenizer, *, table=None, answers=None, **kwargs) -> None:
        super().__init__(tokenizer, **kwargs)
        self.table = table or {}
        self.answers = answers or {}
        self.score_rows: list[int] = []
        self.configs: list = []

    def _marker(self, prompt: torch.Tensor, keys) -> str:
        text = self.tokenizer.decode(prompt)
        return next(marker for marker in keys if marker in text)

    def _score(self, sequences, return_logits=False, prompt_lengths=None, return_entropy=False):
        self.score_rows.append(len(sequences))
        log_probs = torch.zeros(len(sequences), max(len(s) for s in sequences))
        for row, (sequence, cut) in enumerate(zip(sequences, prompt_lengths, strict=True)):
            table = self.table[self._marker(sequence[:cut], self.table)]
            for position in range(cut, len(sequence)):
                log_probs[row, position] = table.get(int(sequence[position]), UNLIKELY)
        return ScoreResult(log_probs=log_probs)

    def _generate(self, prompts, config):
        self.configs.append(config)
        samples = []
        for prompt in prompts:
            answer = self.answers[self._marker(prompt, self.answers)]
            ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
            tokens = torch.tensor([*ids, self.tokenizer.eos_token_id])
            samples.append(GeneratedSample(tokens=tokens, log_probs=None, finished=True))
        return samples


def _request(response: str, reference: str | None = "4", question: str = "What is 2+2?"):
    prompt = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Earlier question"},
        {"role": "assistant", "content": "Earlier answer"},
        {"role": "user", "content": question},
    ]
    return {"prompt": prompt, "response": response, "reference": reference}


def _ids(tokenizer, word: str) -> list[int]:
    return tokenizer(word, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------- the prompt
def test_the_message_fills_the_last_user_message_the_reference_and_the_response():
    template = "P={problem}|R={reference}|A={response}|{{literal}}"
    assert judge_message(_request("It is 4.", "4"), template) == (
        "P=What is 2+2?|R=4|A=It is 4.|{literal}"
    )
    assert judge_message(_request("It is 4.", None), template) == (
        "P=What is 2+2?|R=(none)|A=It is 4.|{literal}"
    )
    no_user = {"prompt": [{"role": "system", "content": "s"}], "response": "x", "reference": None}
    assert judge_message(no_user, template).startswith("P=(none)|")


def test_the_prompt_is_the_message_in_the_judge_chat_template_with_the_generation_prompt(
    tokenizer,
):
    judge = JudgeScorer(ScriptedJudge(tokenizer), JudgeSettings())
    request = _request("It is 4.")
    [prompt] = judge.prompts([request])
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": judge_message(request, JudgeSettings().template)}],
        add_generation_prompt=True,
        return_dict=True,
    )["input_ids"]
    assert prompt.tolist() == list(expected)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------- verdict log-probs
def test_verdict_arithmetic_by_hand():
    log = math.log
    assert verdict_score([log(0.6), log(0.2)], [1.0, 0.0], 0.05) == pytest.approx(0.75)
    assert verdict_score([log(0.1), log(0.3)], [1.0, 0.0], 0.05) == pytest.approx(0.25)
    # three verdicts with their own values: (0.2 * 1 + 0.3 * 0.5 + 0.1 * -1) / 0.6
    three = verdict_score([log(0.2), log(0.3), log(0.1)], [1.0, 0.5, -1.0], 0.05)
    assert three == pytest.approx(0.25 / 0.6)
    assert verdict_score([log(0.01), log(0.02)], [1.0, 0.0], 0.05) is None  # mass 0.03
    assert verdict_score([log(0.01), log(0.02)], [1.0, 0.0], 0.0) == pytest.approx(1 / 3)
    assert verdict_score([-math.inf, -math.inf], [1.0, 0.0], 0.0) is None
    assert verdict_score([math.nan, 0.0], [1.0, 0.0], 0.0) is None
    # far below float64's exp range, the ratio is still exact (log-space)
    assert verdict_score([-2000.0, -2000.0 + log(3)], [1.0, 0.0], 0.0) == pytest.approx(0.25)


def test_verdict_scores_come_from_one_scoring_call_over_every_request_and_verdict(tokenizer):
    yes, no = _ids(tokenizer, "Yes"), _ids(tokenizer, "No")
    assert len(yes) == len(no) == 1
    log = math.log
    policy = ScriptedJudge(
        tokenizer,
        table={
            "[r1]": {yes[0]: log(0.6), no[0]: log(0.2)},
            "[r2]": {yes[0]: log(0.01), no[0]: log(0.02)},  # garbage: mass 0.03
            "[r3]": {yes[0]: log(0.1), no[0]: log(0.3)},
        },
    )
    judge = JudgeScorer(policy, JudgeSettings())
    requests = [_request("[r1]"), _request("[r2]"), _request("[r3]")]
    scores = judge(requests)
    assert scores[0] == pytest.approx(0.75)
    assert scores[1] is None
    assert scores[2] == pytest.approx(0.25)
    assert policy.score_rows == [6]  # 3 requests x 2 verdicts, one call
    assert judge([]) == []


def test_a_verdict_of_several_tokens_sums_their_log_probs(tokenizer):
    words = _ids(tokenizer, "Absolutely not")
    assert len(words) == 3
    yes = _ids(tokenizer, "Yes")[0]
    log = math.log
    table = {yes: log(0.6), words[0]: log(0.5), words[1]: log(0.8), words[2]: log(0.5)}
    settings = JudgeSettings(verdicts={"Yes": 1.0, "Absolutely not": -1.0})
    judge = JudgeScorer(ScriptedJudge(tokenizer, table={"[r1]": table}), settings)
    [[lp_yes, lp_not]] = judge.verdict_log_probs([_request("[r1]")])
    assert lp_yes == pytest.approx(log(0.6))
    assert lp_not == pytest.approx(log(0.2))  # 0.5 * 0.8 * 0.5
    assert judge([_request("[r1]")]) == [pytest.approx((0.6 - 0.2) / 0.8)]


def test_tiny_judge_verdict_log_probs_equal_its_own_forward(tokenizer, tiny):
    settings = JudgeSettings(min_verdict_prob=0.0)  # a random model puts ~0 mass on Yes/No
    judge = JudgeScorer(TransformersWrapper(tiny, tokenizer), settings)
    requests = [_request("It is 4."), _request("It is 5.", None, "What is 3+3?")]
    got = judge.verdict_log_probs(requests)
    scores = judge(requests)
    yes, no = _ids(tokenizer, "Yes")[0], _ids(tokenizer, "No")[0]
    for request, row, score in zip(requests, got, scores, strict=True):
        message = judge_message(request, settings.template)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        with torch.no_grad():
            logits = tiny(torch.tensor([list(ids)])).logits[0, -1].float()
        expected = logits.log_softmax(-1)[[yes, no]]
        # the wrapper's scoring pass and this plain forward sum in other orders
        atol = log_prob_atol(max_abs(logits), tiny.config.vocab_size)
        assert torch.allclose(
            torch.tensor(row, dtype=torch.float64), expected.double(), atol=atol, rtol=0
        )
        p_yes = expected.double().softmax(-1)[0].item()
        # d(p_yes / (p_yes + p_no)) <= (|d lp_yes| + |d lp_no|) / 4
        assert score == pytest.approx(p_yes, abs=atol / 2)


# ---------------------------------------------------------------------- parse mode
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Yes, the answer is correct.", 1.0),
        ("NO. 2 + 2 is 4, not 5.", 0.0),
        ("The answer: no... well, yes", 0.0),  # the first verdict word found
        ("Yesterday I would say Nope", None),  # whole words only
        ("I cannot tell.", None),
        ("", None),
    ],
)
def test_find_verdict(answer, expected):
    assert find_verdict(answer, {"Yes": 1.0, "No": 0.0}) == expected


def test_of_two_verdicts_starting_at_one_place_the_longer_counts():
    verdicts = {"correct": 1.0, "correct but incomplete": 0.5}
    assert find_verdict("Correct but incomplete.", verdicts) == 0.5
    assert find_verdict("Correct, and complete.", verdicts) == 1.0


def test_parse_mode_answers_greedily_and_reads_the_verdict(tokenizer):
    answers = {"[r1]": "Yes.", "[r2]": "Hmm, I am not sure.", "[r3]": "no, it is 4"}
    policy = ScriptedJudge(tokenizer, answers=answers)
    settings = JudgeSettings(mode="parse", max_new_tokens=12)
    judge = JudgeScorer(policy, settings)
    requests = [_request("[r1]"), _request("[r2]"), _request("[r3]")]
    assert judge.answers(requests) == ["Yes.", "Hmm, I am not sure.", "no, it is 4"]
    assert judge(requests) == [1.0, None, 0.0]
    config = policy.configs[-1]
    assert (config.do_sample, config.effective_temperature) == (False, 0.0)
    assert (config.max_new_tokens, config.num_return_sequences) == (12, 1)
    assert policy.score_rows == []  # parse mode never scores


def test_the_factory_pickles_and_builds_a_judge_over_its_model(tiny_model_dir):
    settings = JudgeSettings(mode="parse", max_new_tokens=4)
    factory = JudgeFactory(
        policy=ScoringPolicyFactory(model=str(tiny_model_dir)), settings=settings
    )
    judge = pickle.loads(pickle.dumps(factory))()
    assert isinstance(judge, JudgeScorer)
    assert isinstance(judge.policy, TransformersWrapper)
    assert judge.settings == settings
    [answer] = judge.answers([_request("It is 4.")])
    assert isinstance(answer, str)
    judge.close()


# ---------------------------------------------------------------------- the real SmolLM2
ARITHMETIC = [
    ("What is 7 + 5?", "12", "7 + 5 = 12. The answer is 12.", "7 + 5 = 15. The answer is 15."),
    ("What is 9 - 3?", "6", "9 - 3 = 6. The answer is 6.", "9 - 3 = 2. The answer is 2."),
    ("What is 4 * 3?", "12", "4 * 3 = 12. The answer is 12.", "4 * 3 = 7. The answer is 7."),
]


@pytest.fixture(scope="module")
def smollm2():
    from llmrl.models import load_model

    return load_model("smollm2-135m-instruct", dtype=torch.float32).requires_grad_(False)


@pytest.mark.slow
def test_smollm2_judge_on_transformers_scores_its_own_verdict_softmax_and_ranks_answers(
    smollm2, tokenizer
):
    settings = JudgeSettings()
    judge = JudgeScorer(TransformersWrapper(smollm2, tokenizer), settings)
    requests = [
        _request(answer, reference, question)
        for question, reference, right, wrong in ARITHMETIC
        for answer in (right, wrong)
    ]
    scores = judge(requests)
    yes, no = _ids(tokenizer, "Yes")[0], _ids(tokenizer, "No")[0]
    for request, score in zip(requests, scores, strict=True):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": judge_message(request, settings.template)}],
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            logits = smollm2(torch.tensor([list(ids)])).logits[0, -1].float()
        verdicts = logits.log_softmax(-1)[[yes, no]].double()
        assert verdicts.exp().sum() >= settings.min_verdict_prob  # the judge answers Yes/No
        atol = log_prob_atol(max_abs(logits), smollm2.config.vocab_size)
        assert score == pytest.approx(verdicts.softmax(-1)[0].item(), abs=atol / 2)
    right, wrong = scores[0::2], scores[1::2]
    assert sum(right) / len(right) > sum(wrong) / len(wrong)
