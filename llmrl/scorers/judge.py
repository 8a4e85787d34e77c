"""`JudgeScorer`: a generative LLM judge's verdict on each (problem, reference, response).

The judge reads one user message, :attr:`JudgeSettings.template
<llmrl.config.model_signals.JudgeSettings.template>` filled with the problem (the last user
message of the request's prompt), the reference answer (``(none)`` when the row has none) and
the response, rendered with the judge tokenizer's chat template and its generation prompt.
Its verdict becomes a score in one of two ways (``settings.mode``):

- ``verdict_logprobs``: each verdict word (``Yes``, ``No``) is scored as the first tokens of
  the judge's answer, every (request, verdict) row in ONE scoring call (no sampling):
  ``p_v = exp(sum of the word's token log-probs)`` and the score is
  ``sum_v value_v * p_v / sum_v p_v``; a verdict mass ``sum_v p_v`` below
  ``min_verdict_prob`` means the judge is not answering the question: no verdict (None);
- ``parse``: the judge answers (greedy, ``max_new_tokens``) and the first verdict word found in
  the answer (a whole word, any case) gives its value; none found: no verdict (None).

A None is the caller's to count as a failure and replace by the fallback reward
(:class:`~llmrl.envs.transforms.model_reward.ModelReward`).

Example (hand-computed): ``p_yes = 0.6, p_no = 0.2`` with values 1 and 0 score
``0.6 / 0.8 = 0.75``:

    >>> import math
    >>> round(verdict_score([math.log(0.6), math.log(0.2)], [1.0, 0.0], min_prob=0.05), 12)
    0.75
    >>> find_verdict("Verdict: NO, because 2 + 2 = 4.", {"Yes": 1.0, "No": 0.0})
    0.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from llmrl.config.model_signals import JudgeSettings
from llmrl.data import History, Tokens
from llmrl.data.non_tensor import as_list
from llmrl.scorers.policy_factory import ScoringPolicyFactory, close_policy

if TYPE_CHECKING:
    from llmrl.policies import LLMWrapperBase
    from llmrl.scorers.requests import ScoreRequest

MISSING = "(none)"
"""What the template shows for a row without a reference answer (or a prompt without a user
message)."""


def judge_message(request: ScoreRequest, template: str) -> str:
    """The judge's user message for one request: ``template`` filled with its problem (the
    last user message of its prompt), reference and response."""
    users = [m.get("content") for m in request["prompt"] if m.get("role") == "user"]
    problem = users[-1] if users and users[-1] is not None else MISSING
    reference = request.get("reference")
    return template.format(
        problem=str(problem),
        reference=MISSING if reference is None else str(reference),
        response=str(request["response"]),
    )


def verdict_score(
    log_probs: Sequence[float], values: Sequence[float], min_prob: float
) -> float | None:
    """``sum_v value_v * p_v / sum_v p_v`` from each verdict's log-prob, or None when the
    verdict mass ``sum_v p_v`` is below ``min_prob`` (or nothing finite)."""
    lp = torch.tensor(list(log_probs), dtype=torch.float64)
    if lp.isnan().any():
        return None
    log_mass = torch.logsumexp(lp, dim=0)
    if not torch.isfinite(log_mass) or math.exp(float(log_mass)) < min_prob:
        return None
    weights = (lp - log_mass).exp()
    return float((weights * torch.tensor(list(values), dtype=torch.float64)).sum())


def find_verdict(answer: str, verdicts: Mapping[str, float]) -> float | None:
    """The value of the verdict word found first in ``answer`` (a whole word, any case; of two
    starting at one place, the longer), or None when it holds none."""
    found: tuple[int, int, float] | None = None
    for word, value in verdicts.items():
        pattern = rf"(?<!\w){re.escape(word.strip())}(?!\w)"
        match = re.search(pattern, answer, flags=re.IGNORECASE)
        if match is not None:
            candidate = (match.start(), -len(match.group()), value)
            found = candidate if found is None else min(found, candidate)
    return None if found is None else found[2]


class JudgeScorer:
    """A judge policy's verdicts on scoring requests (see the module docstring).

    Args:
        policy: the judge model's policy (any backend; its weights or engines are shared by
            the scoring and answering twins built here).
        settings: the judge's template, mode, verdict words and their values.
    """

    def __init__(self, policy: LLMWrapperBase, settings: JudgeSettings) -> None:
        self.policy = policy
        self.settings = settings
        self.tokenizer = policy.tokenizer
        self.words = list(settings.verdicts)
        self.values = [float(settings.verdicts[word]) for word in self.words]
        self.verdict_tokens = [self._tokens(word) for word in self.words]
        # both read token ids: the scorer (prompt, verdict) rows, the answerer prompts
        self._scorer = _tokens_twin(
            policy,
            generate=False,
            return_log_probs=True,
            return_logits=False,
            return_entropy=False,
            score_responses_only=True,
        )
        self._answerer = _tokens_twin(
            policy,
            generate=True,
            return_log_probs=False,
            num_samples=1,
            generate_kwargs={"max_new_tokens": settings.max_new_tokens, "do_sample": False},
        )

    def _tokens(self, word: str) -> torch.Tensor:
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def __call__(self, requests: list[ScoreRequest]) -> list[float | None]:
        """Each request's score, or None where the judge gave no verdict."""
        if not requests:
            return []
        if self.settings.mode == "parse":
            return [
                find_verdict(answer, self.settings.verdicts) for answer in self.answers(requests)
            ]
        return [
            verdict_score(row, self.values, self.settings.min_verdict_prob)
            for row in self.verdict_log_probs(requests)
        ]

    def prompts(self, requests: list[ScoreRequest]) -> list[torch.Tensor]:
        """The judge's prompt tokens of each request: its user message in the judge's chat
        template, with the generation prompt (the answer comes next)."""
        chats = [
            [{"role": "user", "content": judge_message(request, self.settings.template)}]
            for request in requests
        ]
        rendered = History.from_chats(chats).apply_chat_template(
            self.tokenizer, add_generation_prompt=True, chat_template=self.policy.chat_template
        )
        return rendered.as_list("input_ids")

    def verdict_log_probs(self, requests: list[ScoreRequest]) -> list[list[float]]:
        """Per request, the log-prob of each verdict word (in ``settings.verdicts``' order) as
        the first tokens of the judge's answer: every (request, verdict) row in one scoring
        call."""
        if not requests:
            return []
        prompts = [p for p in self.prompts(requests) for _ in self.verdict_tokens]
        answers = [tokens for _ in requests for tokens in self.verdict_tokens]
        rows = len(prompts)
        batch = TensorDict(
            {"tokens": Tokens.from_sequences(prompt=prompts, response=answers)}, batch_size=[rows]
        )
        with torch.no_grad():
            scored = self._scorer(batch).get(self._scorer.keys["log_probs"])
        sums = [float(values.double().sum()) for values in scored.as_list("response")]
        width = len(self.verdict_tokens)
        return [sums[start : start + width] for start in range(0, rows, width)]

    def answers(self, requests: list[ScoreRequest]) -> list[str]:
        """The judge's greedy answer to each request (``settings.max_new_tokens`` at most)."""
        if not requests:
            return []
        prompts = self.prompts(requests)
        batch = TensorDict(
            {"tokens": Tokens.from_sequences(prompt=prompts)}, batch_size=[len(prompts)]
        )
        out = self._answerer(batch)
        return [str(text) for text in as_list(out.get(self._answerer.keys["text"]).response)]

    def close(self) -> None:
        """Stop the judge's engines and batchers (see :func:`close_policy`)."""
        close_policy(self.policy)


def _tokens_twin(policy: LLMWrapperBase, *, generate: bool, **settings: Any) -> LLMWrapperBase:
    """``policy`` reading ragged ``tokens`` (``prompt`` to answer, ``full`` to score)."""
    return policy.get_new_version(
        generate=generate,
        input_mode="tokens",
        input_key=("tokens", "prompt" if generate else "full"),
        pad_output=False,
        **settings,
    )


@dataclass(frozen=True, kw_only=True)
class JudgeFactory:
    """Builds a :class:`JudgeScorer` where it runs (picklable): the judge's policy from
    ``policy``, with ``settings`` (``rewards.judge``)."""

    policy: ScoringPolicyFactory
    settings: JudgeSettings

    def __call__(self) -> JudgeScorer:
        """The judge, its model loaded (or its server reached) in this process."""
        return JudgeScorer(self.policy(), self.settings)
