"""Load a stage's YAML config, apply ``--set`` overrides, validate, and report every problem.

Every stage (``prepare``, ``sft``, ``grpo``, ``evaluate``) describes its settings as a
:class:`ConfigModel` and reads them with :func:`load_config`. Unknown keys are errors, not silent
no-ops, so a typo such as ``eval_fracton`` fails the run before it starts, and a bad config lists
all of its problems at once, each as ``<file>: <dotted.path>: <message>``.

Reading is bounded, whatever the file holds: at most :data:`MAX_CONFIG_BYTES` bytes, mappings
and lists nested at most :data:`MAX_YAML_DEPTH` deep, at most :data:`MAX_YAML_ALIASES` aliases
and :data:`MAX_YAML_NODES` values once aliases are expanded (a "billion laughs" alias bomb is
refused while it is still a few hundred bytes of parsed nodes), integers of at most
:data:`MAX_YAML_INT_DIGITS` digits; floats must be finite (no ``.inf``, no ``.nan``), and the
numeric fields of the stage configs have upper bounds (``MAX_*`` below) so that a typo such as
``steps=1e30`` fails at load time, naming the field.
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

MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this (1 MiB) is refused before it is parsed."""
MAX_YAML_DEPTH = 64
"""Mappings and lists nested deeper than this are refused (configs nest ~5 deep)."""
MAX_YAML_ALIASES = 100
"""``*alias`` references allowed in one config file."""
MAX_YAML_NODES = 100_000
"""Values (scalars, lists, mappings) in one config once its aliases are expanded."""
MAX_YAML_INT_DIGITS = 100
"""Longer integer literals are refused while parsing (no field takes a number that large)."""

MAX_STEPS = 10_000_000
"""Upper bound of step counts and step intervals (``steps``, ``warmup_steps``, ``every``...)."""
MAX_BATCH = 1_000_000
"""Upper bound of per-step counts: batch sizes, prompts and samples per step, accumulation."""
MAX_ROWS = 1_000_000_000
"""Upper bound of row and problem counts (``max_train_rows``, ``train_size``...)."""
MAX_TOKENS = 1 << 20
"""Upper bound of token budgets (``max_new_tokens``, ``max_length``): about a million tokens."""
MAX_TEXT_CHARS = 1 << 24
"""Upper bound of text-size settings (``max_row_chars``): 16 Mi characters."""
MAX_CLUSTER = 100_000
"""Upper bound of a topology's counts (engines, GPUs, ranks, CPU cores, env workers) and of
its memory sizes in GiB."""
MAX_LR = 1.0
"""Upper bound of learning rates: an AdamW step moves a weight by about ``lr``."""
MAX_TIMEOUT_S = 86_400.0
"""Upper bound of timeouts, in seconds (a day)."""
MAX_SEED = 2**63 - 1
"""Upper bound of seeds (torch's generators take 64-bit seeds)."""

MAX_QUOTED_CHARS = 200
"""User text quoted in an error message (a field name, a value) is cut to this many
characters, its control characters escaped (see :func:`quoted`)."""
MAX_PROBLEM_CHARS = 2000
"""One problem line of a :class:`ConfigError` is cut to this many characters."""

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

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A config that cannot be used; the message lists every problem, one per line.

    ``problems`` holds the same lines, each ``<origin>: <dotted.path>: <message>`` where the
    origin is the config file or the ``--set`` override the value came from.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = [quoted(problem, MAX_PROBLEM_CHARS) for problem in problems]
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


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def quoted(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` as an error message may show it, in at most ``limit`` characters: control
    characters and lone surrogates escaped (``\\n``, ``\\x1b``, ``\\ud800``), a long text cut
    with its length told. Quoting a quoted text changes nothing.

    Example:
        >>> quoted("a\\nb" + "x" * 300, limit=50)
        'a\\\\nbxxxxxx... (303 characters in all)'
    """
    shown = _CONTROL.sub(_escaped, text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return f"{shown[: max(limit - 40, 0)]}... ({len(text)} characters in all)"


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape", "backslashreplace").decode("ascii")


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
    with path.open("rb") as stream:
        raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            [f"{path}: config file is over {MAX_CONFIG_BYTES} bytes; a config is a few kilobytes"]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path}: config file is not UTF-8 text ({error.reason})"]) from None
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as error:
        raise ConfigError([f"{path}: {_describe_yaml_error(error)}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: the top level must be a mapping of keys to values, got {_kind(data)}"]
        )
    return data


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the limits of this module: nesting depth and alias count while
    composing, the expanded size of the composed document, and the length of integers."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _limit(f"more than {MAX_YAML_ALIASES} aliases", event.start_mark)
            return super().compose_node(parent, index)
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if self._depth >= MAX_YAML_DEPTH:
                raise _limit(f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def compose_document(self) -> Any:
        node = super().compose_document()
        size = _expanded_size(node)
        if size < 0:
            raise _limit("an alias inside the value it names (infinitely nested)", node.start_mark)
        if size > MAX_YAML_NODES:
            raise _limit(
                f"more than {MAX_YAML_NODES} values once its aliases are expanded",
                node.start_mark,
            )
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(char.isdigit() for char in node.value)
        if digits > MAX_YAML_INT_DIGITS:
            raise _limit(
                f"an integer of {digits} digits (at most {MAX_YAML_INT_DIGITS})", node.start_mark
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _limit(problem: str, mark: Any) -> yaml.YAMLError:
    return yaml.MarkedYAMLError(problem=f"{problem}; refused", problem_mark=mark)


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has with every alias expanded, counted without expanding it
    (each distinct node once, children first, without recursion); -1 when an alias refers to a
    node that holds it (``&a [*a]``: infinite)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        children = _children(node)
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(child)] for child in children), 1 << 62)
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            return -1
        open_nodes.add(id(node))
        pending.append((node, True))
        pending.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _load_yaml(text: str) -> Any:
    """``text`` parsed as YAML within this module's limits (``yaml.YAMLError`` past them)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
            [
                f"--set {_shown(override)}: expected KEY=VALUE, e.g. split.seed=3 or "
                "generate.train_size=100"
            ]
        )
    keys = tuple(part.strip() for part in key.split("."))
    if any(not part for part in keys):
        raise ConfigError([f"--set {_shown(override)}: empty key segment in {key!r}"])
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(
            [f"--set {_shown(override)}: the value {raw!r} is not valid YAML ({problem}); quote it"]
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
                [f"--set {_shown(override)}: '{where}' is {_kind(child)}, not a mapping of keys"]
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
        if detail["type"] == "int_parsing_size":  # pydantic: "Unable to parse input string..."
            message = "Input is too large a number for this integer field"
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
            return f"--set {_shown(override)}"
    return origin


def _shown(override: str) -> str:
    """An override as a message names it: a long value cut, so the reason after it shows."""
    return quoted(override, limit=200)


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
