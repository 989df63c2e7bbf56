"""Session-id extraction from request headers (pure; used by the router and the simulator)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["DEFAULT_SESSION_HEADERS", "VLLM_ROUTER_SESSION_HEADERS", "extract_session_id"]

DEFAULT_SESSION_HEADERS: tuple[str, ...] = ("x-session-id",)
"""Ours: only an explicit session header identifies a session."""

VLLM_ROUTER_SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",
    "x-user-id",
    "x-tenant-id",
    "x-correlation-id",
    "x-request-id",
    "x-trace-id",
)
"""vllm-router 0.1.17's list, checked in order (``shared/ROUTER.md``)."""


def extract_session_id(
    headers: Mapping[str, str], names: Sequence[str] = DEFAULT_SESSION_HEADERS
) -> tuple[str, str] | None:
    """The first non-empty session header as ``(lower-case name, value)``, or None.

    Args:
        headers: request headers; lookup is case-insensitive when ``headers`` is (aiohttp's
            CIMultiDict is); plain dicts should use lower-case keys.
        names: header names in priority order.
    """
    for name in names:
        value = headers.get(name)
        if value:
            return name.lower(), value
    return None
