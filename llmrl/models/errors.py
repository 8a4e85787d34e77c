"""Errors raised while resolving and loading models."""

from __future__ import annotations


class ModelSpecError(ValueError):
    """A model spec names nothing llmrl can load (unknown name, missing file, bad format)."""


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message names the extra that provides it."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'llmrl[{extra}]'"
        )
        self.package = package
        self.extra = extra
        self.purpose = purpose

    def __reduce__(self) -> tuple:
        # Rebuild from the constructor's arguments, so the error survives pickling (Ray).
        return (type(self), (self.package, self.extra, self.purpose))


class UnsafeModelError(ModelSpecError):
    """A model folder would run code it carries (custom Python code, pickled weights, a chat
    template reaching past its sandbox); the message names the ``model.*`` setting that allows
    it, where one does."""
