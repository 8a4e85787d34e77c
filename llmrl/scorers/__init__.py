"""Models as the training signal: reward models, LLM judges and teachers, and their serving.

Layer 2 (policies, envs, objectives): imports layers 0-1 and ``policies``.

A text scorer (:class:`~llmrl.scorers.reward_model.RewardModelScorer`, the judge) turns
:class:`~llmrl.scorers.requests.ScoreRequest` dicts into one score per request; the teacher
scores a batch's tokens. :class:`~llmrl.scorers.server.ModelServer` hosts one scorer in a Ray
actor and :class:`~llmrl.scorers.client.ModelClient` calls a role's servers (or a served URL)
with a deadline and bounded retries.
"""

from llmrl.scorers.client import ModelClient
from llmrl.scorers.errors import ModelCallError
from llmrl.scorers.judge import JudgeFactory, JudgeScorer
from llmrl.scorers.policy_factory import ScoringPolicyFactory, close_policy
from llmrl.scorers.requests import ScoreRequest, request_from_chat, requests_from_batch
from llmrl.scorers.reward_model import NotAClassifierError, RewardModelFactory, RewardModelScorer
from llmrl.scorers.server import ModelServer, start_model_servers
from llmrl.scorers.teacher import (
    TeacherFactory,
    TeacherScorer,
    TokenizerMismatchError,
    check_same_tokenizer,
)

__all__ = [
    "JudgeFactory",
    "JudgeScorer",
    "ModelCallError",
    "ModelClient",
    "ModelServer",
    "NotAClassifierError",
    "RewardModelFactory",
    "RewardModelScorer",
    "ScoreRequest",
    "ScoringPolicyFactory",
    "TeacherFactory",
    "TeacherScorer",
    "TokenizerMismatchError",
    "check_same_tokenizer",
    "close_policy",
    "request_from_chat",
    "requests_from_batch",
    "start_model_servers",
]
