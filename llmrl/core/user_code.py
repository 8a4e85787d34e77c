"""Finding the user's own code: an import path (``pkg.module:name``) or an installed entry point.

A user brings a task or a reward function without editing llmrl. A config names it as
``my_pkg.rewards:score`` (a module and an attribute, dots allowed after the colon for nested
attributes) or, once their package is installed, by a short name that the package registers in
the entry-point group :data:`ENTRY_POINT_GROUP`::

    # the user's pyproject.toml
    [project.entry-points."llmrl.tasks"]
    my-task = "my_pkg.tasks:MyTask"

:func:`load_object` imports it; anything that goes wrong (no such module, an error raised while
the module imports, no such attribute, no such entry point) raises :class:`UserCodeError`, whose
message names the config field, the spec and the import error, so a run is refused before
anything starts.

Example:
    >>> load_object("json:dumps", field="task").__name__
    'dumps'
    >>> is_import_path("my_pkg.rewards:score"), is_import_path("gsm8k")
    (True, False)
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from typing import Any

ENTRY_POINT_GROUP = "llmrl.tasks"
"""The entry-point group through which installed packages register task and reward names."""

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class UserCodeError(ValueError):
    """A config names user code that cannot be loaded; the message names field and cause.

    ``detail`` is the message without the field (for validators, whose errors carry it)."""

    def __init__(self, field: str, detail: str) -> None:
        self.field, self.detail = field, detail
        super().__init__(f"{field}: {detail}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.field, self.detail))


def is_import_path(spec: str) -> bool:
    """Whether ``spec`` has the ``module:attribute`` form."""
    return bool(_IMPORT_PATH.match(spec))


def entry_point_names() -> list[str]:
    """The names installed packages register in :data:`ENTRY_POINT_GROUP`, sorted."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def find_entry_point(name: str) -> metadata.EntryPoint | None:
    """The entry point called ``name`` in :data:`ENTRY_POINT_GROUP`, None when none is."""
    found = list(metadata.entry_points(group=ENTRY_POINT_GROUP, name=name))
    return found[0] if found else None


def load_object(spec: str, *, field: str) -> Any:
    """The object ``spec`` names: ``module:attribute`` or an entry point's name.

    Raises:
        UserCodeError: naming ``field``, ``spec`` and what failed (the module's own import
            error, with its type, when importing it raised).
    """
    if is_import_path(spec):
        module_name, _, attribute = spec.partition(":")
        return _load(module_name, attribute, spec, field)
    entry_point = find_entry_point(spec)
    if entry_point is None:
        registered = ", ".join(entry_point_names()) or "none"
        raise UserCodeError(
            field,
            f"{spec!r} is neither an import path ('package.module:name') nor an entry point "
            f"of group {ENTRY_POINT_GROUP!r} (installed: {registered})",
        )
    module_name, _, attribute = entry_point.value.partition(":")
    where = f"{spec!r} (entry point {entry_point.value!r})"
    return _load(module_name, attribute.strip(), where, field)


def _load(module_name: str, attribute: str, what: str, field: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise UserCodeError(
            field, f"{what} does not import: {type(error).__name__}: {error}"
        ) from error
    found: Any = module
    for part in attribute.split(".") if attribute else ():
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UserCodeError(
                field, f"{what}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return found
