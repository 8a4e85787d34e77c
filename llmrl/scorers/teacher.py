"""`TeacherScorer`: a distillation teacher's log-probs of the student's own tokens.

On-policy distillation (``loss.distillation``) compares, token by token, the teacher's
log-prob of each token the student sampled with the student's: the teacher scores the batch's
``("tokens", "full")`` in one scoring pass (no generation) and the batch gains
``teacher_log_probs``, laid out like the ``ref_log_probs`` of a reference model
(:func:`~llmrl.policies.token_log_probs.batch_log_probs`: prompt and response split, ``full``
zero outside the assistant mask).

The comparison only means something on the same token ids: :func:`check_same_tokenizer`
refuses a teacher whose tokenizer differs from the student's (vocabulary, end-of-sequence and
padding tokens), naming both models and the first difference.

Example:
    >>> from llmrl.models import load_tokenizer
    >>> student = load_tokenizer("smollm2-135m-instruct")
    >>> tokenizer_difference(student, student) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from llmrl.policies.token_log_probs import batch_log_probs, scoring_twin
from llmrl.scorers.policy_factory import ScoringPolicyFactory, close_policy

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llmrl.policies import LLMWrapperBase

TEACHER_LOG_PROBS = "teacher_log_probs"
"""The batch key of the teacher's log-probs."""

SPECIAL_TOKENS = ("eos_token", "pad_token")
"""The special tokens a teacher must share with its student: where responses end, and what
pads them."""


class TokenizerMismatchError(ValueError):
    """A teacher's tokenizer differs from its student's; the message names both models and
    the first difference."""


class TeacherScorer:
    """Writes a teacher's log-probs of a batch's own tokens (see the module docstring).

    Args:
        policy: the teacher's policy (any backend; a scoring twin shares its weights).
        out_key: where the log-probs go.
        assistant_only: ``full`` holds 0 outside the batch's assistant mask.
    """

    def __init__(
        self,
        policy: LLMWrapperBase,
        *,
        out_key: str = TEACHER_LOG_PROBS,
        assistant_only: bool = True,
    ) -> None:
        self.policy = policy
        self.scorer = scoring_twin(policy)
        self.out_key = out_key
        self.assistant_only = assistant_only

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``out_key`` written (a ragged :class:`~llmrl.data.LogProbs`)."""
        with torch.no_grad():
            log_probs = batch_log_probs(self.scorer, batch, self.assistant_only)
        batch.set(self.out_key, log_probs)
        return batch

    def close(self) -> None:
        """Stop the teacher's engines and batchers (see :func:`close_policy`)."""
        close_policy(self.policy)


@dataclass(frozen=True, kw_only=True)
class TeacherFactory:
    """Builds a :class:`TeacherScorer` where it runs (picklable).

    Args:
        policy: the teacher's policy factory.
        student: the student's model spec; when given, the teacher's tokenizer is checked
            against the student's (:func:`check_same_tokenizer`) before the model loads.
    """

    policy: ScoringPolicyFactory
    student: str | None = None

    def __call__(self) -> TeacherScorer:
        """The teacher, its model loaded (or its server reached) in this process."""
        if self.student is not None:
            trust = bool(self.policy.load_options.get("trust_remote_code", False))
            check_same_tokenizer(
                self.student,
                self.policy.load_tokenizer(),
                teacher_name=self.policy.name,
                trust_remote_code=trust,
            )
        return TeacherScorer(self.policy())


def check_same_tokenizer(
    student: PreTrainedTokenizerBase | str | Path,
    teacher: PreTrainedTokenizerBase | str | Path,
    *,
    student_name: str | None = None,
    teacher_name: str | None = None,
    trust_remote_code: bool = False,
) -> None:
    """Refuse a teacher whose tokenizer differs from the student's.

    ``student`` and ``teacher`` are tokenizers or model specs (their tokenizers are loaded);
    the names default to the specs, or the tokenizers' ``name_or_path``.

    Raises:
        TokenizerMismatchError: the vocabularies (token id -> string) or the end-of-sequence or
            padding tokens differ; the message names both models and the first difference.
    """
    student_tokenizer, student_name = _tokenizer(student, student_name, trust_remote_code)
    teacher_tokenizer, teacher_name = _tokenizer(teacher, teacher_name, trust_remote_code)
    difference = tokenizer_difference(student_tokenizer, teacher_tokenizer)
    if difference is not None:
        raise TokenizerMismatchError(
            f"teacher {teacher_name!r} does not share the tokenizer of student "
            f"{student_name!r}: {difference}. Distillation compares the two models' log-probs "
            "of the same token ids, so the teacher must use the student's tokenizer (a model "
            "of the same family)"
        )


def tokenizer_difference(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase
) -> str | None:
    """The first difference between two tokenizers, in words (None: none): the vocabulary
    sizes and the first token id mapping to different strings, then the special tokens."""
    student_ids = {index: token for token, index in student.get_vocab().items()}
    teacher_ids = {index: token for token, index in teacher.get_vocab().items()}
    problems = []
    if len(student_ids) != len(teacher_ids):
        problems.append(
            f"vocabulary sizes differ ({len(student_ids)} tokens for the student, "
            f"{len(teacher_ids)} for the teacher)"
        )
    for index in sorted(student_ids.keys() | teacher_ids.keys()):
        if student_ids.get(index) != teacher_ids.get(index):
            problems.append(
                f"token id {index} is {_shown(student_ids.get(index))} for the student and "
                f"{_shown(teacher_ids.get(index))} for the teacher"
            )
            break
    if problems:
        return "; ".join(problems)
    for name in SPECIAL_TOKENS:
        ours, theirs = getattr(student, f"{name}_id"), getattr(teacher, f"{name}_id")
        if ours != theirs:
            return (
                f"the {name} differs (id {ours} {getattr(student, name)!r} for the student, "
                f"id {theirs} {getattr(teacher, name)!r} for the teacher)"
            )
    return None


def _shown(token: str | None) -> str:
    return "missing" if token is None else repr(token)


def _tokenizer(
    given: PreTrainedTokenizerBase | str | Path, name: str | None, trust_remote_code: bool
) -> tuple[PreTrainedTokenizerBase, str]:
    """A tokenizer and the name messages give it, from a tokenizer or a model spec."""
    if isinstance(given, (str, Path)):
        from llmrl.models import load_tokenizer

        return load_tokenizer(given, trust_remote_code=trust_remote_code), name or str(given)
    return given, name or str(getattr(given, "name_or_path", "") or type(given).__name__)
