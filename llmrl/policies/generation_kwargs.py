"""Generation settings with one vocabulary across backends, validated once.

Users write the same keys whatever runs underneath; each backend maps them to its own names
(``to_transformers``, ``to_vllm``). Backend spellings are accepted as aliases: ``max_tokens``
(vLLM) means ``max_new_tokens``, ``n`` means ``num_return_sequences``, ``stop`` means
``stop_sequences``.

Example:
    >>> GenerationKwargs.from_kwargs(max_tokens=64, n=4, temperature=0.7).num_return_sequences
    4
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ALIASES = {"max_tokens": "max_new_tokens", "n": "num_return_sequences", "stop": "stop_sequences"}


class GenerationKwargsError(ValueError):
    """Invalid generation settings; the message names the setting and the value."""


@dataclass(frozen=True)
class GenerationKwargs:
    """Sampling settings shared by every policy backend.

    ``temperature=None`` means 1.0 when sampling and 0 (greedy) when ``do_sample=False``.
    ``stop_sequences`` end a response when it contains one of them (the text is kept).
    """

    max_new_tokens: int = 256
    num_return_sequences: int = 1
    temperature: float | None = None
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    do_sample: bool = True
    stop_sequences: tuple[str, ...] = field(default_factory=tuple)
    skip_special_tokens: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        _check_int("num_return_sequences", self.num_return_sequences, minimum=1)
        for name in ("temperature", "top_p", "repetition_penalty"):
            _check_number(name, getattr(self, name), optional=name == "temperature")
        for name in ("do_sample", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise GenerationKwargsError(
                    f"{name} must be true or false, got {getattr(self, name)!r}"
                )
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=-(2**63))
        if self.temperature is not None and self.temperature < 0:
            raise GenerationKwargsError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise GenerationKwargsError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k is not None:
            _check_int("top_k", self.top_k, minimum=1)
        if self.repetition_penalty <= 0:
            raise GenerationKwargsError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}"
            )
        if not self.do_sample and self.temperature not in (None, 0, 0.0):
            raise GenerationKwargsError(
                f"do_sample=False (greedy) contradicts temperature={self.temperature}; "
                "drop the temperature or set it to 0"
            )
        if self.do_sample and self.temperature == 0:
            raise GenerationKwargsError(
                "temperature=0 means greedy decoding; set do_sample=False instead of sampling "
                "at temperature 0"
            )
        if isinstance(self.stop_sequences, str) or not all(
            isinstance(s, str) and s for s in self.stop_sequences
        ):
            raise GenerationKwargsError(
                f"stop_sequences must be a list of non-empty strings, got {self.stop_sequences!r}"
            )

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any] | None = None, **more: Any) -> GenerationKwargs:
        """Build from user kwargs, mapping backend aliases and rejecting unknown keys."""
        merged = {**(kwargs or {}), **more}
        values: dict[str, Any] = {}
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in merged.items():
            name = ALIASES.get(key, key)
            if name not in known:
                raise GenerationKwargsError(
                    f"unknown generation kwarg {key!r}; known: {sorted(known | set(ALIASES))}"
                )
            if name in values and values[name] != value:
                raise GenerationKwargsError(f"{key!r} and its alias both set, to different values")
            values[name] = value
        if "stop_sequences" in values and values["stop_sequences"] is not None:
            stops = values["stop_sequences"]
            if not isinstance(stops, (str, list, tuple)):
                raise GenerationKwargsError(
                    f"stop_sequences must be a list of non-empty strings, got {stops!r}"
                )
            values["stop_sequences"] = (stops,) if isinstance(stops, str) else tuple(stops)
        return cls(**values)

    def replace(self, **changes: Any) -> GenerationKwargs:
        """A validated copy with some settings changed (aliases accepted)."""
        renamed = {ALIASES.get(key, key): value for key, value in changes.items()}
        return GenerationKwargs.from_kwargs({**dataclasses.asdict(self), **renamed})

    @property
    def effective_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 1.0 if self.do_sample else 0.0

    def to_transformers(self) -> dict[str, Any]:
        """Keyword arguments for ``transformers``' ``generate``."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "num_return_sequences": self.num_return_sequences,
            "do_sample": self.do_sample,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.do_sample:
            out.update(temperature=self.effective_temperature, top_p=self.top_p)
            out["top_k"] = self.top_k if self.top_k is not None else 0  # 0 disables top-k in HF
        if self.stop_sequences:
            out["stop_strings"] = list(self.stop_sequences)
        return out

    def to_vllm(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams``."""
        return {
            "max_tokens": self.max_new_tokens,
            "n": self.num_return_sequences,
            "temperature": self.effective_temperature,
            "top_p": self.top_p,
            "top_k": self.top_k if self.top_k is not None else -1,
            "repetition_penalty": self.repetition_penalty,
            "stop": list(self.stop_sequences) or None,
            "include_stop_str_in_output": True,
            "skip_special_tokens": self.skip_special_tokens,
            "seed": self.seed,
        }


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GenerationKwargsError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise GenerationKwargsError(f"{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GenerationKwargsError(f"{name} must be a finite number, got {value!r}")
