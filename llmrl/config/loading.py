"""Load a stage's YAML config, apply ``--set`` overrides, validate, and report every problem.

Every stage (``prepare``, ``sft``, ``grpo``, ``evaluate``) describes its settings as a
:class:`ConfigModel` and reads them with :func:`load_config`. Unknown keys are errors, not silent
no-ops, so a typo such as ``eval_fracton`` fails the run before it starts, and a bad config lists
all of its problems at once, each as ``<file>: <dotted.path>: <message>``.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

ModelT = TypeVar("ModelT", bound="ConfigModel")

_LEADING_KEY = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*): ")


class ConfigModel(BaseModel):
    """Base of every llmrl config section: unknown keys are rejected and assignments validated.

    Subclasses declare each setting with ``Field(description=...)``; the description is the
    documentation a user reads.

    Example::

        class TrainConfig(ConfigModel):
            lr: float = Field(1e-5, gt=0, description="learning rate")

        config = load_config(TrainConfig, "configs/train.yaml", ["lr=3e-5"])
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(ValueError):
    """A config that cannot be used; the message lists every problem, one per line.

    ``problems`` holds the same lines, each ``<origin>: <dotted.path>: <message>`` where the
    origin is the config file or the ``--set`` override the value came from.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    def __reduce__(self) -> tuple:
        return (type(self), (self.problems,))

    def located(self, path: str | Path | None, overrides: Iterable[str] = ()) -> ConfigError:
        """This error, each ``<dotted.field>: ...`` problem told where its field was set.

        For problems found after loading (a stage rejecting a value it was given): the problem
        gets `` (set by --set KEY=VALUE)`` or `` (set in FILE)``; a field left at its default
        keeps its problem as it is.
        """
        data = _read_yaml(Path(path)) if path is not None else {}
        overridden = {_parse_override(override)[0]: override for override in overrides}
        problems = []
        for problem in self.problems:
            named = _LEADING_KEY.match(problem)
            keys = tuple(named.group(1).split(".")) if named else ()
            origin = _origin_of(keys, "", overridden) if keys else ""
            if origin:
                problem += f" (set by {origin})"
            elif keys and _has_key(data, keys):
                problem += f" (set in {path})"
            problems.append(problem)
        return ConfigError(problems)


def load_config(
    model_cls: type[ModelT], path: str | Path | None, overrides: Iterable[str] = ()
) -> ModelT:
    """Read ``path`` (YAML), apply ``overrides`` (``a.b.c=value``), and validate as ``model_cls``.

    ``path=None`` starts from an empty mapping (the model's defaults); an empty file is an empty
    mapping too. Override values are parsed as YAML, so ``true``, ``3``, ``0.1``, ``[a, b]`` and
    ``null`` become a bool, an int, a float, a list and None; nested mappings are created as
    needed. An override of a key the model does not have fails like an unknown key in the file.

    Raises:
        ConfigError: the file is missing or not valid YAML, an override is malformed, or the
            values do not validate; the message names the file (or override) and the key.

    Example::

        config = load_config(PrepareConfig, "configs/prepare.yaml", ["split.seed=3"])
    """
    origin = str(path) if path is not None else "config"
    data = _read_yaml(Path(path)) if path is not None else {}
    overridden: dict[tuple[str, ...], str] = {}
    for override in overrides:
        keys, value = _parse_override(override)
        _set_nested(data, keys, value, override)
        overridden[keys] = override
    try:
        return model_cls.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, model_cls, origin, overridden)) from None


def dump_config(model: BaseModel) -> str:
    """The resolved config as YAML (every field, defaults included), for printing and logging."""
    return yaml.safe_dump(
        model.model_dump(mode="json"), sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError([f"{path}: config file {what}"])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path}: config file is not UTF-8 text ({error.reason})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"{path}: {_describe_yaml_error(error)}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: the top level must be a mapping of keys to values, got {_kind(data)}"]
        )
    return data


def _describe_yaml_error(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    detail = f"{context}, {problem}" if context else problem
    if mark is None:
        return f"invalid YAML: {detail}"
    return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {detail}"


def _parse_override(override: str) -> tuple[tuple[str, ...], Any]:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            [f"--set {override}: expected KEY=VALUE, e.g. split.seed=3 or generate.train_size=100"]
        )
    keys = tuple(part.strip() for part in key.split("."))
    if any(not part for part in keys):
        raise ConfigError([f"--set {override}: empty key segment in {key!r}"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(
            [f"--set {override}: the value {raw!r} is not valid YAML ({problem}); quote it"]
        ) from None
    return keys, value


def _set_nested(data: dict[str, Any], keys: tuple[str, ...], value: Any, override: str) -> None:
    node = data
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            where = ".".join(keys[: depth + 1])
            raise ConfigError(
                [f"--set {override}: '{where}' is {_kind(child)}, not a mapping of keys"]
            )
        node = child
    node[keys[-1]] = value


def _describe(
    error: ValidationError,
    model_cls: type[BaseModel],
    origin: str,
    overridden: dict[tuple[str, ...], str],
) -> list[str]:
    problems = []
    for detail in error.errors(include_url=False):
        loc = tuple(str(part) for part in detail["loc"])
        label = _origin_of(loc, origin, overridden)
        dotted = _dotted(detail["loc"])
        if detail["type"] == "extra_forbidden":
            problems.append(f"{label}: {_unknown_key(model_cls, detail['loc'])}")
            continue
        message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if detail["type"] not in ("missing", "value_error", "assertion_error"):
            got = _short_repr(detail.get("input"))
            if got is not None:
                message = f"{message} (got {got})"
        for line in message.splitlines():
            if dotted:
                problems.append(f"{label}: {dotted}: {line}")
                continue
            # A model-level check names its field at the start of each line ("source: ...").
            named = _LEADING_KEY.match(line)
            if named:
                label = _origin_of(tuple(named.group(1).split(".")), origin, overridden)
            problems.append(f"{label}: {line}")
    return problems


def _origin_of(loc: tuple[str, ...], origin: str, overridden: dict[tuple[str, ...], str]) -> str:
    """The ``--set`` override a problem comes from, when one covers its path, else the file."""
    for keys, override in reversed(overridden.items()):
        size = min(len(keys), len(loc))
        if size and keys[:size] == loc[:size]:
            return f"--set {override}"
    return origin


def _has_key(data: Any, keys: tuple[str, ...]) -> bool:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def _dotted(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _unknown_key(model_cls: type[BaseModel], loc: Sequence[str | int]) -> str:
    dotted = _dotted(loc)
    allowed = _fields_at(model_cls, loc[:-1])
    if not allowed:
        return f"unknown key '{dotted}'"
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{dotted}' (allowed here: {', '.join(allowed)}){hint}"


def _fields_at(model_cls: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the (nested) model at ``loc``, or [] when that is not a model."""
    current: Any = model_cls
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel class in ``annotation`` (``Model`` or ``Model | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if _model_in(arg) is not None]
        if len(models) == 1:
            return models[0]
    return None


def _short_repr(value: Any) -> str | None:
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, (list, dict)):
        return _kind(value)
    return None


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({_short_repr(value) or '...'})"
