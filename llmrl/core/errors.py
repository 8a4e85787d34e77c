"""Errors every layer may raise: an optional dependency that is not installed."""

from __future__ import annotations


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
