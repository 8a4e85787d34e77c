"""Refuse a model folder that would run code it carries, before ``transformers`` reads it.

Three things in a Hugging Face model folder can run code: Python modules named by ``auto_map``
(custom code, run on import), pickled weights (``pytorch_model.bin``, ``*.pt``, ``*.pkl``:
unpickling can call any function), and a chat template that reaches Python internals from the
Jinja sandbox (``{{ cycler.__init__.__globals__.os }}``). :func:`check_model_folder` reads only
the folder's JSON files, file names and template text (it imports, unpickles and renders
nothing) and raises :class:`~llmrl.models.errors.UnsafeModelError` naming what it refused and the
:class:`~llmrl.config.common.ModelConfig` setting that allows it, if any.

Example:
    check_model_folder(Path("my-model"), trust_remote_code=False, allow_pickled_weights=False)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from llmrl.models.errors import ModelSpecError, UnsafeModelError

MAX_JSON_BYTES = 64 * 2**20  # a tokenizer_config.json with many added tokens is a few MB
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json",
                "preprocessor_config.json")  # fmt: skip
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
NOT_WEIGHTS = {"training_args.bin"}  # pickled, but transformers never loads it
DUNDER = re.compile(r"__\w+__")
# Methods that change a list, dict or set in place: the immutable sandbox refuses them at render.
MUTATING_METHODS = frozenset(
    ("append", "extend", "insert", "pop", "popitem", "remove", "reverse", "clear", "update",
     "setdefault", "add", "discard", "difference_update", "intersection_update",
     "symmetric_difference_update")
)  # fmt: skip
# Attributes of the template globals a template may use (cycler.next(), dict.fromkeys(...)).
GLOBAL_ATTRIBUTES = {"cycler": {"next", "reset", "current"}, "dict": {"fromkeys"}}


def check_model_folder(folder: Path, trust_remote_code: bool, allow_pickled_weights: bool) -> None:
    """Raise :class:`UnsafeModelError` when ``folder`` asks for custom code (unless
    ``trust_remote_code``), holds only pickled weights (unless ``allow_pickled_weights``) or
    carries a chat template that reaches Python internals."""
    if not trust_remote_code:
        for name, mapping in _auto_maps(folder):
            classes = ", ".join(f"{k} -> {v}" for k, v in list(mapping.items())[:3])
            raise UnsafeModelError(
                f"model directory {folder} asks to run its own Python code (auto_map in {name}: "
                f"{classes}); refused: set model.trust_remote_code: true only if you trust that "
                "code"
            )
    if not allow_pickled_weights:
        pickled = _pickled_weights(folder)
        if pickled:
            raise UnsafeModelError(
                f"model directory {folder} holds pickled weights ({', '.join(pickled[:3])}) and "
                "no .safetensors; unpickling can run code, so they are refused: convert them to "
                "safetensors, or set model.allow_pickled_weights: true only if you trust the files"
            )
    for origin, template in _chat_templates(folder):
        problem = template_problem(template)
        if problem is not None:
            raise UnsafeModelError(
                f"model directory {folder}: the chat template in {origin} {problem}; refused "
                "(no setting allows it): remove or replace that template"
            )


def _read_json(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelSpecError(f"{path}: {path.stat().st_size} bytes, over {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:
        raise ModelSpecError(f"{path}: not valid JSON ({type(error).__name__})") from None


def _auto_maps(folder: Path) -> Iterator[tuple[str, dict]]:
    for name in CODE_CONFIGS:
        path = folder / name
        if path.is_file():
            data = _read_json(path)
            mapping = data.get("auto_map") if isinstance(data, dict) else None
            if mapping:
                yield name, mapping if isinstance(mapping, dict) else {"auto_map": mapping}


def _pickled_weights(folder: Path) -> list[str]:
    """The pickled weight files, when the folder has no safetensors weights."""
    files = [p for p in folder.iterdir() if p.is_file()]
    if any(p.suffix == ".safetensors" for p in files):
        return []  # transformers is told to read only these (use_safetensors)
    return sorted(
        p.name for p in files if p.suffix.lower() in PICKLE_SUFFIXES and p.name not in NOT_WEIGHTS
    )


def _chat_templates(folder: Path) -> Iterator[tuple[str, str]]:
    """Every chat template transformers may read from the folder: ``(file, template)``."""
    for name in ("tokenizer_config.json", "chat_template.json", "processor_config.json"):
        path = folder / name
        data = _read_json(path) if path.is_file() else None
        templates = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(templates, str):
            yield name, templates
        elif isinstance(templates, list):
            for entry in templates:
                if isinstance(entry, dict) and isinstance(entry.get("template"), str):
                    yield f"{name} ({entry.get('name')!r})", entry["template"]
    extra = folder / "additional_chat_templates"
    for path in [folder / "chat_template.jinja", *sorted(extra.glob("*.jinja"))]:
        if path.is_file():
            yield path.relative_to(folder).as_posix(), path.read_text(errors="replace")


def template_problem(template: str) -> str | None:
    """What in a Jinja chat template reaches past the sandbox (None: nothing found).

    Refused: attributes or keys that are Python internals (``__class__``, ``mro``, any
    ``_private`` name, a dunder string anywhere), the ``attr`` filter with a computed name,
    attributes of the template globals (``cycler``, ``joiner``, ``namespace``, ``lipsum``, ...)
    beyond their documented methods, in-place changes to lists and dicts (``x.append(1)``) and
    ``**`` (a huge power). Parsing compiles nothing and runs nothing.
    """
    import jinja2
    from jinja2 import nodes

    try:
        tree = _parser().parse(template)
    except jinja2.TemplateSyntaxError as error:
        return f"is not valid Jinja (line {error.lineno}: {error.message})"
    for node in tree.find_all(nodes.Node):
        where = f" (line {node.lineno})"
        if isinstance(node, nodes.Const) and isinstance(node.value, str):
            found = DUNDER.search(node.value)
            if found:
                return f"names the Python internal {found.group()!r}{where}"
        elif isinstance(node, nodes.Getattr):
            problem = _attribute_problem(node.attr, node.node)
            if problem is not None:
                return problem + where
        elif isinstance(node, nodes.Filter) and node.name == "attr":
            if not all(isinstance(a, nodes.Const) for a in node.args):
                return f"uses the attr filter with a computed name{where}"
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            if node.node.attr in MUTATING_METHODS:
                return f"changes a value in place (.{node.node.attr}()){where}"
        elif isinstance(node, nodes.Pow):
            return f"raises to a power (**), which can exhaust memory{where}"
    return None


def _attribute_problem(name: str, owner: Any) -> str | None:
    from jinja2 import nodes
    from jinja2.sandbox import (
        UNSAFE_ASYNC_GENERATOR_ATTRIBUTES,
        UNSAFE_COROUTINE_ATTRIBUTES,
        UNSAFE_FUNCTION_ATTRIBUTES,
        UNSAFE_GENERATOR_ATTRIBUTES,
        UNSAFE_METHOD_ATTRIBUTES,
    )

    internal = (
        UNSAFE_FUNCTION_ATTRIBUTES
        | UNSAFE_METHOD_ATTRIBUTES
        | UNSAFE_GENERATOR_ATTRIBUTES
        | UNSAFE_COROUTINE_ATTRIBUTES
        | UNSAFE_ASYNC_GENERATOR_ATTRIBUTES
        | {"mro", "tb_frame", "f_globals", "f_locals", "f_builtins"}
    )
    if name.startswith("_") or name in internal:
        return f"reaches the Python internal attribute {name!r}"
    is_global = isinstance(owner, nodes.Name) and owner.name in _global_names()
    if is_global and name not in GLOBAL_ATTRIBUTES.get(owner.name, ()):
        return f"reaches attribute {name!r} of the template global {owner.name!r}"
    return None


def _global_names() -> set[str]:
    """The globals of a chat template's environment: Jinja's and those transformers adds."""
    from jinja2.defaults import DEFAULT_NAMESPACE

    return {*DEFAULT_NAMESPACE, "raise_exception", "strftime_now", "dict", "namespace"}


def _parser() -> Any:
    """A Jinja environment that parses what transformers' template environment parses (its
    ``{% generation %}`` tag and loop controls); used to parse, never to render."""
    import jinja2
    import jinja2.ext
    from jinja2 import nodes

    class GenerationTag(jinja2.ext.Extension):
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    return jinja2.Environment(extensions=[GenerationTag, jinja2.ext.loopcontrols])
