"""`RewardModelScorer`: a sequence-classification model's score of each (prompt, response).

The reward model is an ``AutoModelForSequenceClassification`` folder (its config's
``architectures`` name a ``*ForSequenceClassification`` class) with one or two labels. Each
request is rendered as one text and tokenized here, whatever the backend:

- with the model tokenizer's chat template when it has one: the prompt's messages and the
  response as an assistant message (no generation prompt);
- otherwise as plain text: the prompt messages' contents, then the response, separated by
  blank lines (``"prompt\\n\\nresponse"``), with the tokenizer's special tokens.

Texts longer than ``max_length`` tokens keep their last ``max_length`` (the response). The
score is the classifier's raw logit for one label, ``logit[1] - logit[0]`` for two (the log-odds
of the "good" label); a model with more labels is refused, and so is a folder that is no
classifier (a causal LM), by name.

Backends (:class:`RewardModelFactory`): ``transformers`` (the classifier on ``device``, rows
padded on the right with the model's pad token, so its own forward picks each row's last
token), ``vllm`` (vLLM's pooling runner, ``LLM.classify`` without its activation: the raw
logits) and a URL (a ``vllm serve`` of the classifier, its ``/classify`` endpoint).

Example (hand-computed): one label scores its logit, two their difference:

    >>> score_of([0.25]), score_of([1.0, 3.5])
    (0.25, 2.5)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from llmrl.models import ModelSpecError, as_dtype, model_location
from llmrl.policies.remote_vllm import RemoteEngineError, RemoteVLLMEngine
from llmrl.scorers.policy_factory import ScoringPolicyFactory

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from llmrl.config.model_signals import RewardModelSettings
    from llmrl.scorers.requests import ScoreRequest
    from llmrl.topology.model_roles import ModelRoleSpec

Logits = Callable[[list[list[int]]], list[list[float]]]
"""A backend: token-id sequences to each one's classifier logits."""

CLASSIFIER_SUFFIX = "ForSequenceClassification"


class NotAClassifierError(ModelSpecError):
    """The reward model's folder holds no usable sequence classifier; names the folder."""


def score_of(logits: Sequence[float]) -> float:
    """A reward from one row's classifier logits: the logit of a one-label model, the
    difference ``logit[1] - logit[0]`` of a two-label one."""
    if len(logits) == 1:
        return float(logits[0])
    if len(logits) == 2:
        return float(logits[1]) - float(logits[0])
    raise ValueError(f"a reward model has 1 or 2 labels; got {len(logits)} logits")


def check_classifier(config: PretrainedConfig, name: str) -> None:
    """Refuse a config that is no 1- or 2-label ``*ForSequenceClassification`` model."""
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(arch.endswith(CLASSIFIER_SUFFIX) for arch in architectures):
        what = ", ".join(architectures) or f"a {config.model_type!r} model with no architectures"
        raise NotAClassifierError(
            f"reward model {name} is not a sequence classifier: its config names {what}; a "
            f"reward model is an AutoModelForSequenceClassification folder (*{CLASSIFIER_SUFFIX})"
        )
    if config.num_labels not in (1, 2):
        raise NotAClassifierError(
            f"reward model {name} has {config.num_labels} labels; a reward model has 1 (its "
            "logit is the score) or 2 (logit[1] - logit[0])"
        )


def render(tokenizer: PreTrainedTokenizerBase, request: ScoreRequest, max_length: int) -> list[int]:
    """The token ids the classifier reads for one request (see the module docstring), the
    last ``max_length`` of them."""
    messages = [*request["prompt"], {"role": "assistant", "content": request["response"]}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = "\n\n".join(str(message["content"]) for message in messages)
        ids = tokenizer(text)["input_ids"]
    return list(ids[-max_length:])


class RewardModelScorer:
    """Scores requests with a classifier backend (see the module docstring).

    Args:
        tokenizer: the reward model's tokenizer.
        logits: the backend (:data:`Logits`).
        name: the model, as messages name it.
        max_length: tokens each row keeps (its end).
        batch_rows: rows per backend call.
        close: what releases the backend (None: nothing).
    """

    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase,
        logits: Logits,
        name: str,
        max_length: int = 2048,
        batch_rows: int = 16,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.logits = logits
        self.name = name
        self.max_length = max_length
        self.batch_rows = batch_rows
        self._close = close

    def __call__(self, requests: list[ScoreRequest]) -> list[float]:
        """One score per request, in order."""
        sequences = [render(self.tokenizer, r, self.max_length) for r in requests]
        scores: list[float] = []
        for start in range(0, len(sequences), self.batch_rows):
            chunk = sequences[start : start + self.batch_rows]
            rows = self.logits(chunk)
            if len(rows) != len(chunk):
                raise RuntimeError(f"{self.name} returned {len(rows)} scores for {len(chunk)} rows")
            scores.extend(score_of(row) for row in rows)
        return scores

    def close(self) -> None:
        """Release the backend (a vLLM engine's processes, HTTP connections)."""
        if self._close is not None:
            self._close()

    def __repr__(self) -> str:
        return f"RewardModelScorer({self.name!r})"


class TransformersClassifier:
    """The transformers backend: rows padded on the right with the model's pad token (one row
    at a time when it has none), so the model's own forward picks each row's last token."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.pad_id = model.config.pad_token_id
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def __call__(self, sequences: list[list[int]]) -> list[list[float]]:
        if self.pad_id is None:
            return [row for s in sequences for row in self._forward([s])]
        return self._forward(sequences)

    def _forward(self, sequences: list[list[int]]) -> list[list[float]]:
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id or 0, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.logits.float().cpu().tolist()


class VLLMClassifier:
    """The vLLM backend: the pooling runner's ``classify`` without its activation, the raw
    logits of each row's last token."""

    def __init__(self, llm: Any) -> None:
        from vllm import PoolingParams

        self.llm = llm
        self.params = PoolingParams(use_activation=False)

    def __call__(self, sequences: list[list[int]]) -> list[list[float]]:
        prompts = [{"prompt_token_ids": list(s)} for s in sequences]
        outputs = self.llm.classify(prompts, pooling_params=self.params, use_tqdm=False)
        return [[float(v) for v in output.outputs.probs] for output in outputs]


class RemoteClassifier(RemoteVLLMEngine):
    """A ``vllm serve`` of a classifier: ``/classify`` with token ids and no activation (the
    raw logits). Errors name the URL (:class:`RemoteEngineError`)."""

    def __call__(self, sequences: list[list[int]]) -> list[list[float]]:
        body = {
            "model": self.model,
            "input": [[int(t) for t in s] for s in sequences],
            "use_activation": False,
        }
        answer = self._request("POST", "/classify", body)
        data = sorted(answer.get("data") or [], key=lambda entry: entry["index"])
        if len(data) != len(sequences):
            raise RemoteEngineError(
                f"{self.url}/classify returned {len(data)} rows for {len(sequences)} inputs"
            )
        return [[float(v) for v in entry["probs"]] for entry in data]


@dataclass(frozen=True, kw_only=True)
class RewardModelFactory:
    """Builds a :class:`RewardModelScorer` where it runs (picklable).

    Args:
        engine: where the model is and how it runs (a model spec or a ``url``, ``backend``,
            ``dtype``, ``device``, vLLM settings, load options): the fields a model role's
            engine has, shared with the judge's and the teacher's factories.
        max_length: tokens of prompt + response the classifier reads (the end is kept).
        batch_rows: rows per forward (transformers) or per engine call.
        timeout_s: seconds one HTTP request to a URL may take.

    Example:
        >>> engine = ScoringPolicyFactory(url="http://rm:8000", served_model="rm")
        >>> RewardModelFactory(engine=engine, max_length=512).name
        'http://rm:8000'
    """

    engine: ScoringPolicyFactory
    max_length: int = 2048
    batch_rows: int = 16
    timeout_s: float = 120.0

    @classmethod
    def from_role(
        cls, role: ModelRoleSpec, settings: RewardModelSettings, **run_options: Any
    ) -> RewardModelFactory:
        """The factory of a ``topology.reward_model`` engine, with the run's ``settings``;
        ``run_options`` go to :meth:`ScoringPolicyFactory.from_role` (``seed``, ``threads``,
        ``tokenizer``, ``load_options``)."""
        engine = ScoringPolicyFactory.from_role(role, **run_options)
        return cls(engine=engine, max_length=settings.max_length, timeout_s=settings.timeout_s)

    @property
    def name(self) -> str:
        """The model spec, or the URL."""
        return self.engine.name

    def __call__(self) -> RewardModelScorer:
        """The scorer, its model loaded (or its server reached) in this process."""
        engine = self.engine
        if engine.threads:
            torch.set_num_threads(engine.threads)
        tokenizer = engine.load_tokenizer()
        if engine.url is not None:
            remote = RemoteClassifier(engine.url, engine.served_model, timeout_s=self.timeout_s)
            return self._scorer(tokenizer, remote, remote.close)
        location, options = self._checked_location()
        if engine.backend == "vllm":
            return self._vllm(tokenizer, location)
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            location, dtype=as_dtype(engine.dtype), **options
        )
        model = model.to(engine.device).eval().requires_grad_(False)
        return self._scorer(tokenizer, TransformersClassifier(model))

    def _scorer(
        self, tokenizer: Any, logits: Logits, close: Callable[[], None] | None = None
    ) -> RewardModelScorer:
        return RewardModelScorer(
            tokenizer=tokenizer,
            logits=logits,
            name=self.name,
            max_length=self.max_length,
            batch_rows=self.batch_rows,
            close=close,
        )

    def _checked_location(self) -> tuple[str, dict[str, Any]]:
        """The model's folder and loading options, its config checked (:func:`check_classifier`)."""
        from transformers import AutoConfig

        trust = bool(self.engine.load_options.get("trust_remote_code", False))
        pickled = bool(self.engine.load_options.get("allow_pickled_weights", False))
        location, options = model_location(
            str(self.engine.model), trust_remote_code=trust, allow_pickled_weights=pickled
        )
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust, **options)
        check_classifier(config, self.name)
        if not pickled:
            options["use_safetensors"] = True
        return location, {**options, "trust_remote_code": trust}

    def _vllm(self, tokenizer: Any, location: str) -> RewardModelScorer:
        from llmrl.policies.vllm_engine import VLLMEngine

        engine = self.engine
        vllm_engine = VLLMEngine(
            location,
            tensor_parallel_size=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            dtype=engine.dtype,
            seed=engine.seed,
            enable_prefix_caching=False,
            max_model_len=engine.max_model_len or self.max_length,
            enforce_eager=engine.enforce_eager,
            cpu_kv_cache_gb=engine.cpu_kv_cache_gb,
            trust_remote_code=bool(engine.load_options.get("trust_remote_code", False)),
            runner="pooling",
        )
        return self._scorer(tokenizer, VLLMClassifier(vllm_engine.llm), vllm_engine.close)
