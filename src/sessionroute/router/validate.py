"""Input validation before placement: the one set of rules for what a generation request must
look like, applied by the live router to every request, under every policy.

A request that breaks a rule is answered with a 400 (415 for the media type) before any policy
sees it, so nothing is pinned, reserved or forwarded. The status codes are vllm-router
0.1.17's (axum's ``Json`` extractor: 400 for a body that is not valid JSON or not the route's
shape, 415 without ``Content-Type: application/json``), and vLLM's own API server answers the
same requests with 400/415 too (``validate_json_request``), so a client sees the error it would
have seen from the worker, without a worker's time spent on it.

Rules:

* **media type**: ``application/json`` or a ``+json`` suffix type (parameters such as
  ``charset=utf-8`` allowed); anything else, or none, is :class:`UnsupportedMediaType`;
* **body**: strict JSON (RFC 8259: UTF-8, no ``NaN``/``Infinity``, no trailing bytes) whose
  top level is an object; parsed by ``pydantic_core.from_json`` (pydantic's ``jiter``
  parser, already a dependency);
* **shape** by route: ``model``, when present, a string; ``/v1/chat/completions`` a non-empty
  ``messages`` list of objects with a string ``role``; ``/v1/completions`` a ``prompt`` string
  or non-empty list (or vLLM's ``prompt_embeds``); ``/v1/responses`` and ``/v1/embeddings`` an
  ``input`` string or non-empty list (embeddings: or vLLM's chat-style ``messages``). A
  missing ``model`` is accepted: vLLM serves the request with its one model;
* **session id**: at most ``max_bytes`` bytes (256 by default, as a UUID needs 36) and no
  control characters (``0x00-0x1f``, ``0x7f``): an id is a key the router keeps for hours.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic_core

from sessionroute.errors import MalformedRequest

__all__ = [
    "DEFAULT_MAX_SESSION_ID_BYTES",
    "InvalidJSON",
    "UnsupportedMediaType",
    "check_media_type",
    "check_session_id",
    "parse_body",
    "worker_url_problem",
]

DEFAULT_MAX_SESSION_ID_BYTES = 256
"""Longest session id accepted, in bytes (``--max-session-id-bytes``)."""

_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


class InvalidJSON(MalformedRequest):
    """The body is empty or not strict JSON."""


class UnsupportedMediaType(MalformedRequest):
    """The request's ``Content-Type`` is not JSON (an HTTP 415)."""


def check_media_type(value: bytes | None) -> None:
    """Accept ``application/json`` (or ``application/*+json``), with parameters.

    Raises:
        UnsupportedMediaType: naming what was sent.
    """
    if value == b"application/json":  # the common case, without a split
        return
    if value is not None:
        media = value.partition(b";")[0].strip().lower()
        if media == b"application/json" or (
            media.startswith(b"application/") and media.endswith(b"+json")
        ):
            return
    got = "none" if value is None else repr(value.decode("latin-1"))
    raise UnsupportedMediaType(
        f"expected 'Content-Type: application/json', got {got}",
    )


def check_session_id(value: bytes, max_bytes: int) -> None:
    """A session id as sent (trailing blanks stripped) must be short and printable.

    Raises:
        MalformedRequest: over ``max_bytes`` bytes, or with a control character.
    """
    if len(value) > max_bytes:
        raise MalformedRequest(
            f"session id of {len(value)} bytes exceeds the limit of {max_bytes} bytes"
        )
    if _CONTROL.search(value) is not None:
        raise MalformedRequest("session id contains a control character")


def parse_body(data: bytes, route: str) -> dict[str, Any]:
    """The request body parsed and checked for ``route`` (module docstring).

    Args:
        data: the whole body.
        route: the request path (``/v1/chat/completions``, ...); other paths get only the
            object and ``model`` checks.

    Raises:
        MalformedRequest: the body is empty, not strict JSON, not an object, or not the
            route's shape; the message says which.
    """
    if not data:
        raise InvalidJSON("request body is empty (expected a JSON object)")
    try:
        payload = pydantic_core.from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedRequest(
            f"request body must be a JSON object, got {_kind(payload)}",
        )
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise MalformedRequest(f"'model' must be a string, got {_kind(model)}")
    if route == "/v1/chat/completions":
        _check_messages(payload.get("messages"))
    elif route == "/v1/completions":
        if "prompt_embeds" not in payload:
            _check_list_or_str(payload, "prompt")
    elif route == "/v1/responses" or (route == "/v1/embeddings" and "messages" not in payload):
        _check_list_or_str(payload, "input")
    return payload


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        what = "missing" if messages is None else _kind(messages)
        raise MalformedRequest(f"'messages' must be a non-empty list of objects ({what})")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise MalformedRequest(f"messages[{i}] must be an object, got {_kind(m)}")
        if not isinstance(m.get("role"), str):
            raise MalformedRequest(f"messages[{i}] needs a string 'role'")


def _check_list_or_str(payload: dict[str, Any], key: str) -> None:
    value = payload.get(key)
    if isinstance(value, str) or (isinstance(value, list) and value):
        return
    what = "missing" if value is None else _kind(value)
    raise MalformedRequest(f"'{key}' must be a string or a non-empty list ({what})")


def _kind(value: Any) -> str:
    """A JSON type name for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def worker_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a worker, or None: a worker is an ``http://`` or ``https://``
    base URL (``--worker-urls``, ``POST /workers``, ``/add_worker``), kept exactly as given
    (vllm-router matches worker URLs exactly too)."""
    if not url.startswith(("http://", "https://")):
        return f"worker url must start with http:// or https://: {url!r}"
    return None
