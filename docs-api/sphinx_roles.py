"""A griffe extension: llmrl's Sphinx-style cross-references, as the API reference's Markdown.

llmrl's docstrings name other objects with Sphinx roles (``:class:`~llmrl.objectives.GRPOLoss```,
``:meth:`update_policy_weights_```), which Markdown would show as they are written. Before
mkdocstrings renders a docstring, each role becomes

- a cross-reference (``[`GRPOLoss`][llmrl.objectives.grpo.GRPOLoss]``) when its target is an
  object the reference renders (a name of ``llmrl.__all__`` or a documented public member of
  one): autorefs resolves it, and the strict build fails if it cannot;
- inline code otherwise (a private helper, another library's object): the text as written,
  ``~`` shortening a path to its last name, as in Sphinx.

and a sentence ending in ``::`` before a literal block ends in ``:``, as Sphinx shows it.

In a docstring the reference renders, a role whose target names no object at all (a renamed or
removed one) is a warning, so the strict build fails on it.

mkdocs.yml loads it (``extensions: [sphinx_roles.py]``, relative to docs-api/).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`([^`]+)`")
TITLED = re.compile(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", re.S)
# reST's "Example::" before an indented block: Sphinx shows "Example:" (followed by a blank
# line, griffe does not take it for a section's title; the block stays code)
LITERAL_INTRO = re.compile(r"^(?P<line>[ \t]*\S[^\n]*?)::$(?=\n[ \t]*\n)", re.M)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of the ``llmrl`` package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "llmrl":
            return
        import llmrl  # the exports (cheap: nothing but the name -> module table is imported)

        self.collection = loader.modules_collection
        exported = [f"{module}.{name}" for name, module in llmrl._EXPORTS.items()]
        self.rendered = set(exported)
        for path in exported:
            self.rendered.update(documented_members(self.collection[path]))
        # the docstrings the reference shows: an inherited member's is its base class's
        shown_paths = set(self.rendered)
        for path in self.rendered:
            found = self.collection[path]
            if found.is_alias:
                shown_paths.add(found.final_target.path)
        for obj in objects(pkg):
            if obj.docstring is not None:
                shown = obj.path in shown_paths
                text = ROLE.sub(partial(self.rewrite, obj, shown=shown), obj.docstring.value)
                obj.docstring.value = LITERAL_INTRO.sub(r"\g<line>:", text)

    def rewrite(self, obj: griffe.Object, match: re.Match[str], shown: bool) -> str:
        """The Markdown of one role in ``obj``'s docstring (``shown``: the reference renders it)."""
        text = match.group(1)
        titled = TITLED.fullmatch(text)
        written = re.sub(r"\s+", "", titled.group("target") if titled else text)
        target = written.lstrip("~").lstrip(".")
        title = titled.group("title") if titled else target
        if not titled and written.startswith("~"):
            title = target.rsplit(".", 1)[-1]
        path = self.resolve(obj, target)
        if path is None and shown:
            griffe.logger.warning(
                "%s: %s names no object (a renamed or removed one?)", obj.path, match.group(0)
            )
        if path in self.rendered:
            return f"[`{title}`][{path}]"
        return f"`{title}`"

    def resolve(self, obj: griffe.Object, target: str) -> str | None:
        """The full path of the object ``target`` names in ``obj``'s scope; ``""`` for an
        object of another package (not loaded: left unchecked); None when it names nothing."""
        first, _, rest = target.partition(".")
        if first == "llmrl":
            return self.lookup(target)
        scope: griffe.Object | None = obj
        while scope is not None:  # a member of obj or of an enclosing class or module
            found = self.lookup(f"{scope.path}.{target}")
            if found:
                return found
            scope = scope.parent
        try:  # a name imported where obj is defined
            base = obj.resolve(first)
        except griffe.NameResolutionError:  # a path in another package, a builtin, or nothing
            return "" if rest or hasattr(builtins, first) else None
        if base.split(".")[0] != "llmrl":
            return ""
        return self.lookup(f"{base}.{rest}" if rest else base)

    def lookup(self, path: str) -> str | None:
        """The path of the object (an alias's target) at ``path``, or None."""
        try:
            found = self.collection[path]
            if not found.is_alias or found.path in self.rendered:  # an inherited member
                return found.path
            return found.final_target.path
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return self.lookup_export(path)

    def lookup_export(self, path: str) -> str | None:
        """A name llmrl exports, by a package path griffe cannot follow (``llmrl.policies``
        exports ``vLLMWrapper`` lazily, through its ``__getattr__``)."""
        import llmrl

        module, _, name = path.rpartition(".")
        defined = llmrl._EXPORTS.get(name)
        if defined and module.startswith("llmrl") and defined.startswith(module):
            return f"{defined}.{name}"
        return None


def objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and everything defined in it (not what it imports)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from objects(member)


def documented_members(obj: griffe.Object | griffe.Alias) -> set[str]:
    """The paths of ``obj``'s members the reference renders: public ones with a docstring,
    defined in it or inherited (``inherited_members``), not imported into it."""
    target = obj.final_target if obj.is_alias else obj
    members = target.all_members if target.is_class else target.members
    return {
        member.path
        for name, member in members.items()
        if not name.startswith("_")
        and (not member.is_alias or member.inherited)
        and member.docstring is not None
    }
