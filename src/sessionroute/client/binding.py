"""Tag every request of a rollout with its session id: httpx hooks and OpenAI SDK clients.

- httpx (sync and async): a request event hook sets the session header from a
  :class:`SessionIds` log at send time, so every request, every redirect hop and every retry the
  caller makes carries the log's *current* id. A request that already carries the header keeps
  it, and its id is adopted into the log (so it is released with the others).
- OpenAI SDK (sync and async): the header goes into the client's ``default_headers``.
  :func:`with_session` makes a per-rollout copy of a shared client (``with_options``), which
  reuses the shared connection pool; the SDK's own retries resend the same headers, so a retried
  turn keeps its id.

The ``openai`` package is imported only when an OpenAI helper is called.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from sessionroute.client.ids import SESSION_HEADER, SessionIds, router_root, validate_session_id

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

__all__ = [
    "async_session_hook",
    "session_async_httpx_client",
    "session_async_openai",
    "session_hook",
    "session_httpx_client",
    "session_openai",
    "with_session",
]

_OpenAIClient = TypeVar("_OpenAIClient", "OpenAI", "AsyncOpenAI")


def _as_ids(session: SessionIds | str | None) -> SessionIds:
    return session if isinstance(session, SessionIds) else SessionIds(session)


def _tag(request: httpx.Request, ids: SessionIds, header: str) -> None:
    given = request.headers.get(header)
    if given:
        ids.adopt(given)
    else:
        request.headers[header] = ids.current


def session_hook(
    session: SessionIds | str | None = None, header: str = SESSION_HEADER
) -> Callable[[httpx.Request], None]:
    """A sync httpx request hook: ``httpx.Client(event_hooks={"request": [hook]})``.

    Args:
        session: the log whose current id to send (shared with the caller, so
            :meth:`SessionIds.rotate` takes effect on the next request), a fixed id, or None for a
            fresh one.
        header: the session header's name.

    Raises:
        ConfigError: ``session`` is an invalid id.
    """
    ids = _as_ids(session)

    def hook(request: httpx.Request) -> None:
        _tag(request, ids, header)

    return hook


def async_session_hook(
    session: SessionIds | str | None = None, header: str = SESSION_HEADER
) -> Callable[[httpx.Request], Awaitable[None]]:
    """The async twin of :func:`session_hook`, for ``httpx.AsyncClient(event_hooks=...)``."""
    ids = _as_ids(session)

    async def hook(request: httpx.Request) -> None:
        _tag(request, ids, header)

    return hook


def _hooked(
    kwargs: dict[str, Any], hook: Callable[[httpx.Request], Any]
) -> dict[str, list[Callable[..., Any]]]:
    hooks = dict(kwargs.pop("event_hooks", None) or {})
    hooks["request"] = [*hooks.get("request", []), hook]
    return hooks


def session_httpx_client(
    session: SessionIds | str | None = None, *, header: str = SESSION_HEADER, **kwargs: Any
) -> httpx.Client:
    """An ``httpx.Client`` whose every request carries the session header.

    Args:
        session: as for :func:`session_hook`.
        header: the session header's name.
        **kwargs: passed to ``httpx.Client`` (``base_url``, ``timeout``, ...); request hooks in
            ``event_hooks`` run before the session hook.
    """
    hooks = _hooked(kwargs, session_hook(session, header))
    return httpx.Client(event_hooks=hooks, **kwargs)


def session_async_httpx_client(
    session: SessionIds | str | None = None, *, header: str = SESSION_HEADER, **kwargs: Any
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose every request carries the session header.

    Arguments as for :func:`session_httpx_client`.
    """
    hooks = _hooked(kwargs, async_session_hook(session, header))
    return httpx.AsyncClient(event_hooks=hooks, **kwargs)


def with_session(
    client: _OpenAIClient, session_id: str, *, header: str = SESSION_HEADER
) -> _OpenAIClient:
    """A copy of an ``OpenAI``/``AsyncOpenAI`` client that sends ``header: session_id``.

    The copy shares the original's connection pool (``client.with_options``), so making one per
    rollout is cheap; close the original, not the copies. Other default headers are kept.

    Raises:
        ConfigError: ``session_id`` is not a valid header value.
    """
    return client.with_options(default_headers={header: validate_session_id(session_id)})


def _openai_kwargs(
    router_url: str,
    session_id: str,
    header: str,
    api_key: str | None,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    headers: Mapping[str, str] = kwargs.pop("default_headers", None) or {}
    return {
        "base_url": f"{router_root(router_url)}/v1",
        "api_key": api_key or "EMPTY",
        "default_headers": {**headers, header: validate_session_id(session_id)},
        **kwargs,
    }


def session_openai(
    router_url: str,
    session_id: str,
    *,
    api_key: str | None = None,
    header: str = SESSION_HEADER,
    **kwargs: Any,
) -> OpenAI:
    """A new ``openai.OpenAI`` client for the router that tags every request with the session.

    Args:
        router_url: the router's root URL (``/v1`` is appended; a trailing ``/v1`` is accepted).
        session_id: the rollout's id (see :func:`~sessionroute.client.new_session_id`).
        api_key: the router's API key; ``"EMPTY"`` if None (vLLM's convention).
        header: the session header's name.
        **kwargs: passed to ``OpenAI`` (``max_retries``, ``timeout``, ``default_headers``, ...).

    Raises:
        ConfigError: a bad URL or session id.
        ImportError: the ``openai`` package is not installed.
    """
    from openai import OpenAI

    return OpenAI(**_openai_kwargs(router_url, session_id, header, api_key, kwargs))


def session_async_openai(
    router_url: str,
    session_id: str,
    *,
    api_key: str | None = None,
    header: str = SESSION_HEADER,
    **kwargs: Any,
) -> AsyncOpenAI:
    """The async twin of :func:`session_openai`: a new ``openai.AsyncOpenAI`` client."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(**_openai_kwargs(router_url, session_id, header, api_key, kwargs))
