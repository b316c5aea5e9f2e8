"""Why a signal was not accepted. Messages never carry the API key, the secret or the body."""

from __future__ import annotations

from typing import Any


class VerdictError(Exception):
    """Base of every error the sender raises."""


class ConfigError(VerdictError):
    """The sender was given something unusable."""


class KeyReusedError(VerdictError):
    """422: verdict already holds this idempotency key for a different body."""

    def __init__(self, idempotency_key: str, problem: Any) -> None:
        super().__init__(
            "the idempotency key was reused with a different body (422): a key-generation bug; "
            "every signal needs a fresh random key, and a retry must resend the same bytes"
        )
        self.idempotency_key = idempotency_key
        self.problem = problem


class RejectedError(VerdictError):
    """A 4xx other than 409, 422 and 429: the request is wrong and retrying will not help."""

    def __init__(self, status: int, problem: Any) -> None:
        super().__init__(f"verdict rejected the signal with status {status}{_title(problem)}")
        self.status = status
        self.problem = problem


class UnavailableError(VerdictError):
    """Every attempt got a retryable status; resend later with the same key and bytes."""

    def __init__(self, status: int, attempts: int, idempotency_key: str, problem: Any) -> None:
        super().__init__(
            f"verdict was unavailable: status {status} after {attempts} attempts{_title(problem)}"
        )
        self.status = status
        self.attempts = attempts
        self.idempotency_key = idempotency_key
        self.problem = problem


class NetworkError(VerdictError):
    """Every attempt failed in transport; resend later with the same key and bytes."""

    def __init__(self, attempts: int, idempotency_key: str, cause: Exception) -> None:
        super().__init__(f"could not reach verdict after {attempts} attempts: {cause}")
        self.attempts = attempts
        self.idempotency_key = idempotency_key


def _title(problem: Any) -> str:
    """`: <title>` when the problem document has one."""
    if isinstance(problem, dict) and isinstance(problem.get("title"), str):
        return f": {problem['title']}"
    return ""
