"""`ReasoningGymTask`: reasoning-gym's procedural generators and scorers as an llmrl task.

`reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ (an optional extra: ``pip install
'llmrl[ecosystem]'``) generates problems offline from a seed, about a hundred datasets
(``basic_arithmetic``, ``countdown``, ``sudoku``, ``arc_1d``, ...), each with its own scorer
``score_answer(answer, entry)`` that may give partial credit. This task picks one dataset by name
with its own options::

    task: reasoning-gym
    task_options: {dataset: chain_sum, config: {min_terms: 2, max_terms: 3}}
    generate: {train_size: 2000, eval_size: 200, seed: 0}

Problems (:meth:`ReasoningGymTask.generate`): the prompt is the entry's question, the answer its
oracle answer (``""`` for the few datasets that have none and verify the reply instead), and
``fields`` what the scorer needs: the question, the entry's metadata (JSON values; tuples, sets
and non-string dict keys are tagged so the scorer gets them back exactly) and where the entry
came from (``source``: seed, size, index), from which the entry is rebuilt exactly when its
metadata holds a value JSON cannot carry. Train and eval never share a question: a question
belongs to one split by a hash of its text, as every generated task's
(:func:`~llmrl.envs.tasks.base.sample_split`), and each split reads its own seeded stream,
deduplicated.

Scoring (:meth:`ReasoningGymTask.score`): the final answer is the text of the reply's last
``<answer>...</answer>`` (reasoning-gym's own convention; the system prompt says so); a reply
without one scores 0 and is not ``formatted``. Otherwise the reward is the dataset's score of
that answer (at least ``format_reward``), ``correct`` when it reaches ``correct_at``.

Example:
    task = ReasoningGymTask("basic_arithmetic", config={"min_terms": 2, "max_terms": 2})
    problems = task.generate(8, seed=0, split="train")
    task.score(f"<answer>{problems[0].answer}</answer>", problems[0].answer,
               **problems[0].fields).reward
    # -> 1.0
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import math
import re
import warnings
from collections.abc import Iterator
from typing import Any

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import (
    ANSWER_WINDOW_CHARS,
    Score,
    check_format_reward,
    sample_split,
)

INSTALL = "pip install 'llmrl[ecosystem]'"
SPLITS = ("train", "eval")
CHUNK_MIN = 64
"""Entries per generated chunk, at least (a chunk is one reasoning-gym dataset of that size)."""

_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_TAGS = ("__tuple__", "__set__", "__items__", "__float__")


def import_reasoning_gym() -> Any:
    """The ``reasoning_gym`` package; ``ImportError`` naming the extra when it is missing."""
    try:
        with warnings.catch_warnings():  # cellpylib's source warns when it compiles
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
    except ImportError as error:
        raise ImportError(
            f"task 'reasoning-gym' needs the reasoning-gym package ({error}): {INSTALL}"
        ) from error
    return reasoning_gym


def extract_answer(response: str) -> str | None:
    """The stripped text of the last ``<answer>...</answer>`` of ``response`` (None if none),
    looked for in its last :data:`~llmrl.envs.tasks.base.ANSWER_WINDOW_CHARS` characters.

    Example:
        >>> extract_answer("x <answer>1</answer> then <answer> 42 </answer>")
        '42'
    """
    matches = _ANSWER.findall(response[-ANSWER_WINDOW_CHARS:])
    return matches[-1].strip() if matches else None


class ReasoningGymTask:
    """One reasoning-gym dataset as an llmrl task (see the module docstring).

    Args:
        dataset: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``).
        config: the dataset's own options (its config dataclass' fields, without ``seed`` and
            ``size``, which generation sets). For ``composite``: ``{"datasets": [{"name",
            "weight", "config"}, ...]}``.
        system_prompt: a name of reasoning-gym's system prompts (``default``, ``simple``,
            ``direct``, ``DeepSeekZero``, ``chain_of_draft``) or your own text (with a space).
        format_reward: the least reward of a reply that gave an ``<answer>`` (``0 <= r < 1``).
        correct_at: a reply counts as correct when the dataset scores it at least this.
    """

    def __init__(
        self,
        dataset: str,
        config: dict[str, Any] | None = None,
        system_prompt: str = "default",
        format_reward: float = 0.0,
        correct_at: float = 1.0,
    ) -> None:
        rg = import_reasoning_gym()
        names = sorted(rg.factory.DATASETS)
        if not isinstance(dataset, str) or dataset not in rg.factory.DATASETS:
            close = difflib.get_close_matches(str(dataset), names, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(
                f"task_options.dataset: unknown reasoning-gym dataset {dataset!r}; {hint}"
                f"{len(names)} datasets, e.g. {', '.join(names[:12])}, ..."
            )
        config = dict(config or {})
        clash = sorted({"seed", "size"} & set(config))
        if clash:
            raise ValueError(
                f"task_options.config: {clash} are set by generation (generate.seed, "
                "generate.train_size/eval_size), not by the dataset's config"
            )
        prompts = rg.utils.SYSTEM_PROMPTS
        if system_prompt in prompts:
            instructions = prompts[system_prompt]
        elif isinstance(system_prompt, str) and " " in system_prompt.strip():
            instructions = system_prompt
        else:
            raise ValueError(
                f"task_options.system_prompt: {system_prompt!r} is neither one of reasoning-gym's "
                f"prompts ({', '.join(sorted(prompts))}) nor a prompt text"
            )
        if not 0.0 < correct_at <= 1.0:
            raise ValueError(f"task_options.correct_at must be in (0, 1], got {correct_at}")
        self.dataset = dataset
        self.config = config
        self.name = f"reasoning-gym-{dataset}"
        self.instructions = instructions.strip()
        self.format_reward = check_format_reward(format_reward)
        self.correct_at = float(correct_at)
        self._datasets: dict[tuple[int, int], Any] = {}
        self._scorer: Any = self._create(seed=0, size=1)  # refuses a bad config now, by name

    # ------------------------------------------------------------------ generation
    def generate(self, count: int, seed: int, split: str) -> list[Problem]:
        """``count`` distinct problems of ``split`` (``train`` or ``eval``), deterministically
        from ``seed``; the two splits never share a question."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        stream = _stable_int(f"{self.dataset}-{seed}-{split}")
        entries = self._entries(stream, size=max(CHUNK_MIN, 2 * count))
        picked = sample_split(
            count,
            seed,
            split,
            lambda _rng: next(entries),  # reasoning-gym's own seeded stream, not the rng
            key=lambda item: str(item[0]["question"]),
            what=f"reasoning-gym {self.dataset!r}",
        )
        return [
            self._problem(entry, split, seed, number, source)
            for number, (entry, source) in enumerate(picked)
        ]

    def _entries(self, stream: int, size: int) -> Iterator[tuple[dict[str, Any], dict[str, int]]]:
        """Entries of the chunks of ``stream`` (datasets of ``size``), each with its source."""
        for chunk in itertools.count():
            chunk_seed = (stream + 7919 * chunk) % 2**32
            data = self._create(seed=chunk_seed, size=size)
            for index in range(size):
                yield data[index], {"seed": chunk_seed, "size": size, "index": index}

    def _problem(
        self, entry: dict[str, Any], split: str, seed: int, number: int, source: dict[str, int]
    ) -> Problem:
        answer = entry.get("answer")
        fields: dict[str, Any] = {"question": str(entry["question"]), "source": source}
        # a value JSON cannot carry leaves the metadata out: score() rebuilds the entry
        with contextlib.suppress(TypeError):
            fields["metadata"] = encode(entry.get("metadata") or {})
        if answer is None:
            fields["no_answer"] = True
        text = "" if answer is None else str(answer)
        return Problem(
            id=f"{self.name}-{split}-{seed}-{number}",
            prompt=str(entry["question"]),
            answer=text,
            sft_target=None if answer is None else f"<answer>{text}</answer>",
            meta={"dataset": self.dataset},
            fields=fields,
        )

    # ------------------------------------------------------------------ scoring
    def score(self, response: str, answer: str, **fields: Any) -> Score:
        """The dataset's score of the reply's final ``<answer>`` (see the module docstring).

        ``fields``: the problem's (``question``, ``metadata``, ``source``); without them the
        entry is ``{"answer": answer, "metadata": {}}``, enough for datasets that compare
        answers only."""
        parsed = extract_answer(response)
        if parsed is None:
            return Score(0.0, correct=False, formatted=False, parsed=None)
        if self._scorer is None:  # unpickled in an env worker
            self._scorer = self._create(seed=0, size=1)
        entry = self._entry(answer, fields)
        try:
            value = float(self._scorer.score_answer(parsed, entry))
        except Exception:
            # Some scorers raise on an answer they cannot read (int("abc")): a wrong answer.
            # When the oracle answer raises too, the entry is at fault: that is an error.
            if entry.get("answer") is not None:
                self._scorer.score_answer(str(entry["answer"]), entry)
            value = 0.0
        if not math.isfinite(value):
            value = 0.0
        correct = value >= self.correct_at
        return Score(max(value, self.format_reward), correct, formatted=True, parsed=parsed)

    def _entry(self, answer: str, fields: dict[str, Any]) -> dict[str, Any]:
        if "metadata" not in fields and isinstance(fields.get("source"), dict):
            source = fields["source"]
            return self._create(seed=int(source["seed"]), size=int(source["size"]))[
                int(source["index"])
            ]
        return {
            "question": str(fields.get("question", fields.get("prompt", ""))),
            "answer": None if fields.get("no_answer") else answer,
            "metadata": decode(fields.get("metadata") or {}),
        }

    def kind(self, problem: Any) -> str | None:
        """The problem's source dataset (a ``composite`` mixes several), for per-kind accuracy."""
        metadata = getattr(problem, "fields", {}).get("metadata") or {}
        source = metadata.get("source_dataset") if isinstance(metadata, dict) else None
        return source if isinstance(source, str) else None

    # ------------------------------------------------------------------ datasets
    def _create(self, seed: int, size: int) -> Any:
        key = (seed, size)
        if key in self._datasets:
            return self._datasets[key]
        rg = import_reasoning_gym()
        config = dict(self.config)
        if self.dataset == "composite" and isinstance(config.get("datasets"), list):
            from reasoning_gym.composite import DatasetSpec

            config["datasets"] = [
                DatasetSpec(**spec) if isinstance(spec, dict) else spec
                for spec in config["datasets"]
            ]
        try:
            data = rg.create_dataset(self.dataset, seed=seed, size=size, **config)
        except (TypeError, ValueError, AssertionError, KeyError) as error:
            _, config_cls = rg.factory.DATASETS[self.dataset]
            known = sorted(getattr(config_cls, "__dataclass_fields__", {}))
            options = ", ".join(k for k in known if k not in ("seed", "size"))
            raise ValueError(
                f"task_options.config: reasoning-gym {self.dataset!r} refused {self.config}: "
                f"{type(error).__name__}: {error} (its options: {options})"
            ) from None
        if len(self._datasets) >= 4:
            self._datasets.pop(next(iter(self._datasets)))
        self._datasets[key] = data
        return data

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_datasets": {}, "_scorer": None}

    def __repr__(self) -> str:
        return f"ReasoningGymTask({self.dataset!r}, config={self.config})"


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big")


def encode(value: Any) -> Any:
    """``value`` as JSON values that :func:`decode` turns back into it: tuples, sets, dicts
    with non-string keys and non-finite floats are tagged; ``TypeError`` for anything else.

    Example:
        >>> decode(encode({"grid": ((1, 2), (3, 4)), 5: {"a"}})) == {"grid": ((1, 2), (3, 4)),
        ...                                                          5: {"a"}}
        True
    """
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, (bool, int, str)):
        return _plain(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"__float__": repr(float(value))}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(item) for item in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted((encode(item) for item in value), key=repr)}
    if isinstance(value, dict):
        plain = all(type(k) is str and k not in _TAGS for k in value)
        if plain:
            return {k: encode(v) for k, v in value.items()}
        return {"__items__": [[encode(k), encode(v)] for k, v in value.items()]}
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and getattr(value, "shape", None) == ():
        return encode(item())
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _plain(value: Any) -> Any:
    """A subclass of bool, int or str (numpy.str_, an IntEnum) as the plain type."""
    for kind in (bool, int, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == "__tuple__":
                return tuple(decode(item) for item in inner)
            if tag == "__set__":
                return {decode(item) for item in inner}
            if tag == "__items__":
                return {_hashable(decode(k)): decode(v) for k, v in inner}
            if tag == "__float__":
                return float(inner)
        return {k: decode(v) for k, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    return frozenset(key) if isinstance(key, set) else key
