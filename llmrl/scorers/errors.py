"""`ModelCallError`: a call to a model role (reward model, judge, teacher) that gave no answer."""

from __future__ import annotations


class ModelCallError(RuntimeError):
    """A model role's call failed after its retries: names the role, the server, the attempts
    and the cause. Callers that must not crash (a reward) catch it and fall back."""

    def __init__(self, role: str, server: str | int, attempts: int, cause: str) -> None:
        self.role = role
        self.server = server
        self.attempts = attempts
        self.cause = cause
        super().__init__(
            f"{role}: the call to server {server} failed after {attempts} attempt"
            f"{'' if attempts == 1 else 's'}: {cause}"
        )


def describe_error(error: BaseException) -> str:
    """An error in one line: its type and the last line of its message (a Ray error's message
    is the remote traceback, whose last line is the remote error)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__
