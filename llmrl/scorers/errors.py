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
