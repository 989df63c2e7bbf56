"""JSON error responses in OpenAI's shape, and the one place exceptions meet status codes.

Body: ``{"error": {"message": str, "type": str, "code": str}}``. Statuses follow
``shared/ROUTER.md``: malformed JSON 400, unauthenticated 401, payload too large 413, no
available worker 503, upstream unreachable after retries 502, upstream timeout 504.
"""

from __future__ import annotations

import json

from sessionroute.errors import (
    AdmissionRefused,
    ConfigError,
    MalformedRequest,
    NoWorkerAvailable,
    WorkerError,
)
from sessionroute.serve.wire import Response

__all__ = ["error_for_exception", "error_response"]

_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    403: "permission_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    417: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_error",
    501: "not_implemented_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_response(
    status: int,
    message: str,
    code: str,
    *,
    headers: tuple[tuple[str, str], ...] = (),
) -> Response:
    """A JSON error response.

    Args:
        status: HTTP status.
        message: human-readable message.
        code: short machine-readable code (e.g. ``"no_worker_available"``).
        headers: extra response headers as (name, value) pairs.
    """
    body = {"error": {"message": message, "type": _TYPES.get(status, "error"), "code": code}}
    return Response(status, json.dumps(body).encode(), "application/json", headers)


def error_for_exception(exc: BaseException) -> Response:
    """Map a sessionroute error to a JSON error response (500 for anything else)."""
    if isinstance(exc, NoWorkerAvailable):
        return error_response(503, str(exc) or "no worker available", "no_worker_available")
    if isinstance(exc, AdmissionRefused):
        retry = exc.retry_after_s
        headers = (("Retry-After", str(retry)),) if retry is not None else ()
        return error_response(exc.status, str(exc), f"admission_{exc.reason}", headers=headers)
    if isinstance(exc, MalformedRequest):
        return error_response(400, str(exc), "malformed_json")
    if isinstance(exc, WorkerError | ConfigError):
        return error_response(400, str(exc), "invalid_request")
    return error_response(500, "internal router error", "internal_error")
