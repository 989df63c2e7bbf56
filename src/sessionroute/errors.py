"""The error tree. The HTTP boundary maps these to status codes in one place."""

from __future__ import annotations

__all__ = [
    "AdmissionRefused",
    "ConfigError",
    "MalformedRequest",
    "NoWorkerAvailable",
    "SessionRouteError",
    "TraceFormatError",
    "UnknownPolicyError",
    "WorkerError",
]


class SessionRouteError(Exception):
    """Base class of every error sessionroute raises on purpose."""


class ConfigError(SessionRouteError, ValueError):
    """A configuration value is invalid; the message names the key and value."""


class UnknownPolicyError(ConfigError):
    """A policy name is neither built in nor an importable ``module:Class``."""


class NoWorkerAvailable(SessionRouteError):
    """No healthy worker can take the request (HTTP 503 at the boundary)."""


class MalformedRequest(SessionRouteError, ValueError):
    """A request the router cannot place as sent (e.g. a body that is not JSON): HTTP 400."""


class AdmissionRefused(SessionRouteError):
    """The router's admission queue is full, or the request waited there too long: HTTP 503
    (with vllm-router's rate limit: 429 and ``Retry-After`` when full, 408 on a timeout).

    Attributes:
        reason: ``"queue_full"`` or ``"timeout"``.
        status: the HTTP status to answer with.
        retry_after_s: the ``Retry-After`` seconds to send, or None.
    """

    def __init__(
        self, message: str, reason: str, *, status: int = 503, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s


class WorkerError(SessionRouteError, ValueError):
    """A worker admin operation is invalid (duplicate add, unknown remove): HTTP 400."""


class TraceFormatError(SessionRouteError, ValueError):
    """A trace file has a malformed row.

    Attributes:
        path: the file.
        line: 1-based line number in the file.
        field: the offending column or key.
        message: what is wrong with it.
    """

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        super().__init__(f"{path}:{line}: field {field!r}: {message}")
        self.path = path
        self.line = line
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, int, str, str]]:
        # Rebuilt from the four constructor arguments: the default (from ``args``, the one
        # formatted string) fails to unpickle, which broke ``compare``'s process pool.
        return (type(self), (self.path, self.line, self.field, self.message))
