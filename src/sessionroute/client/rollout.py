"""One rollout = one session: clients bound to its id, released exactly once when it ends.

::

    async with Rollout("http://127.0.0.1:30000") as rollout:
        reply = await rollout.openai.chat.completions.create(model=..., messages=...)
        ...                       # every turn carries x-session-id: rollout.session_id
    # here every id the rollout used has been released (success, error, timeout or cancel)

The release on exit runs in its own task awaited through :func:`asyncio.shield`: a rollout that is
cancelled (``asyncio.timeout``, a ``TaskGroup`` sibling failing, ``task.cancel()``) still
releases, and the exit waits at most ``ReleasePolicy.total_timeout_s`` for it. A second
cancellation while waiting stops the wait, not the release.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from sessionroute.client.binding import (
    session_async_httpx_client,
    session_async_openai,
    session_httpx_client,
    session_openai,
    with_session,
)
from sessionroute.client.ids import SESSION_HEADER, SessionIds, router_root
from sessionroute.client.release import (
    ReleasePolicy,
    SessionReleaser,
    SyncSessionReleaser,
    resolve_release,
)
from sessionroute.errors import ConfigError, SessionRouteError

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

__all__ = ["Rollout", "RolloutClosedError", "SyncRollout"]

log = logging.getLogger("sessionroute.client")

_Client = TypeVar("_Client", "OpenAI", "AsyncOpenAI")


class RolloutClosedError(SessionRouteError, RuntimeError):
    """A closed rollout was asked for a client or a new session id."""


class _RolloutBase:
    """Ids, URL and flags shared by :class:`Rollout` and :class:`SyncRollout`."""

    def __init__(
        self,
        router_url: str,
        *,
        session_id: str | None,
        prefix: str,
        api_key: str | None,
        release: bool | None,
        header: str,
        releaser: object | None,
        release_policy: ReleasePolicy | None,
        openai_kwargs: Mapping[str, Any] | None,
        httpx_kwargs: Mapping[str, Any] | None,
    ) -> None:
        if releaser is not None and release_policy is not None:
            raise ConfigError(
                "give either releaser (shared, with its own policy) or release_policy, not both"
            )
        self.router_url = router_root(router_url)
        self.header = header
        self.api_key = api_key
        self.release_enabled = resolve_release(release)
        self._ids = SessionIds(session_id, prefix=prefix)
        self._closed = False
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._release_policy = release_policy
        self._openai_kwargs = dict(openai_kwargs or {})
        self._httpx_kwargs = {
            "base_url": self.router_url,
            "headers": self._auth,
            **(httpx_kwargs or {}),
        }
        self._bound: tuple[str, Any] | None = None

    @property
    def session_id(self) -> str:
        """The id this rollout's requests carry now."""
        return self._ids.current

    @property
    def session_ids(self) -> tuple[str, ...]:
        """Every id this rollout has used (discarded retries included), in first-use order."""
        return self._ids.all

    @property
    def headers(self) -> dict[str, str]:
        """``{header: session_id}``, for a request made with some other client."""
        return {self.header: self._ids.current}

    @property
    def closed(self) -> bool:
        """True once closing has begun (the release may still be running)."""
        return self._closed

    def new_session_id(self) -> str:
        """Start over under a fresh id (a discarded retry); the old id is released at exit.

        Later requests through :attr:`httpx` carry the new id at once; re-read :attr:`openai`
        to get a client bound to it.

        Raises:
            RolloutClosedError: the rollout is closed.
        """
        self._check_open()
        return self._ids.rotate()

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutClosedError(f"rollout {self._ids.current!r} is closed")

    def _bind(self, base: _Client) -> _Client:
        """A copy of the OpenAI client ``base`` bound to the current id (cached per id)."""
        if self._bound is None or self._bound[0] != self.session_id:
            self._bound = (self.session_id, with_session(base, self.session_id, header=self.header))
        bound: _Client = self._bound[1]
        return bound

    def _ids_to_release(self) -> list[str]:
        return list(self._ids.all) if self.release_enabled else []


def _close_quietly(what: str, close: Callable[[], object]) -> None:
    """Call ``close()``; log at debug instead of raising (closing never fails a rollout)."""
    try:
        close()
    except Exception as exc:
        log.debug("closing %s failed: %r", what, exc)


async def _aclose_quietly(what: str, aclose: Callable[[], Awaitable[object]]) -> None:
    """Await ``aclose()``; log at debug instead of raising (closing never fails a rollout)."""
    try:
        await aclose()
    except Exception as exc:
        log.debug("closing %s failed: %r", what, exc)


class Rollout(_RolloutBase):
    """An async rollout bound to one session id (see the module docstring)."""

    def __init__(
        self,
        router_url: str,
        *,
        session_id: str | None = None,
        prefix: str = "",
        api_key: str | None = None,
        release: bool | None = None,
        releaser: SessionReleaser | None = None,
        release_policy: ReleasePolicy | None = None,
        openai_client: AsyncOpenAI | None = None,
        openai_kwargs: Mapping[str, Any] | None = None,
        httpx_kwargs: Mapping[str, Any] | None = None,
        header: str = SESSION_HEADER,
    ) -> None:
        """Describe the rollout; clients and pools are created on first use.

        Args:
            router_url: the router's root URL (a trailing ``/v1`` is accepted).
            session_id: the rollout's id; a fresh ``prefix`` + uuid4 hex if None.
            prefix: prefix of minted ids.
            api_key: the router's key, sent as ``Authorization: Bearer`` by every client here.
            release: release the ids at exit; None ("ask") resolves to True because the router
                cannot be asked and releasing is harmless (:func:`resolve_release`).
            releaser: a shared :class:`SessionReleaser` (not closed here); else the rollout
                makes and closes its own.
            release_policy: bounds for the rollout's own releaser (not with ``releaser``).
            openai_client: a shared ``AsyncOpenAI`` pointed at the router (not closed here);
                :attr:`openai` returns per-session copies of it. Else one is made on first use.
            openai_kwargs: extra ``AsyncOpenAI`` arguments for the client made here.
            httpx_kwargs: extra ``httpx.AsyncClient`` arguments for :attr:`httpx`.
            header: the session header's name.

        Raises:
            ConfigError: a bad URL or id, or both ``releaser`` and ``release_policy``.
        """
        super().__init__(
            router_url,
            session_id=session_id,
            prefix=prefix,
            api_key=api_key,
            release=release,
            header=header,
            releaser=releaser,
            release_policy=release_policy,
            openai_kwargs=openai_kwargs,
            httpx_kwargs=httpx_kwargs,
        )
        self._releaser = releaser
        self._openai_base = openai_client
        self._owns_openai = openai_client is None
        self._httpx: httpx.AsyncClient | None = None
        self._close_task: asyncio.Task[None] | None = None

    @property
    def openai(self) -> AsyncOpenAI:
        """An ``AsyncOpenAI`` client whose requests carry the current session id.

        Raises:
            RolloutClosedError: the rollout is closed.
            ImportError: the ``openai`` package is not installed.
        """
        self._check_open()
        if self._openai_base is None:
            self._openai_base = session_async_openai(
                self.router_url,
                self.session_id,
                api_key=self.api_key,
                header=self.header,
                **self._openai_kwargs,
            )
        return self._bind(self._openai_base)

    @property
    def httpx(self) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` (base URL: the router) tagging every request with the id.

        Raises:
            RolloutClosedError: the rollout is closed.
        """
        self._check_open()
        if self._httpx is None:
            self._httpx = session_async_httpx_client(
                self._ids, header=self.header, **self._httpx_kwargs
            )
        return self._httpx

    async def aclose(self) -> None:
        """Release every id (if enabled) and close the clients made here; exactly once.

        Never raises an error. Safe to call again (later calls wait for the first).
        """
        self._closed = True
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        try:
            ids = self._ids_to_release()
            if ids:
                releaser = self._releaser
                if releaser is None:
                    releaser = SessionReleaser(
                        self.router_url, policy=self._release_policy, api_key=self.api_key
                    )
                try:
                    await releaser.finish_sessions(ids)
                finally:
                    if self._releaser is None:
                        await _aclose_quietly("releaser", releaser.aclose)
        finally:
            if self._httpx is not None:
                await _aclose_quietly("httpx client", self._httpx.aclose)
            if self._owns_openai and self._openai_base is not None:
                await _aclose_quietly("openai client", self._openai_base.close)

    async def __aenter__(self) -> Rollout:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncRollout(_RolloutBase):
    """The blocking twin of :class:`Rollout` (``with SyncRollout(url) as rollout: ...``).

    :attr:`openai` is an ``openai.OpenAI`` client and :attr:`httpx` an ``httpx.Client``; the
    release on exit uses a :class:`SyncSessionReleaser` and blocks at most
    ``ReleasePolicy.total_timeout_s``. Closing is exactly once across threads.
    """

    def __init__(
        self,
        router_url: str,
        *,
        session_id: str | None = None,
        prefix: str = "",
        api_key: str | None = None,
        release: bool | None = None,
        releaser: SyncSessionReleaser | None = None,
        release_policy: ReleasePolicy | None = None,
        openai_client: OpenAI | None = None,
        openai_kwargs: Mapping[str, Any] | None = None,
        httpx_kwargs: Mapping[str, Any] | None = None,
        header: str = SESSION_HEADER,
    ) -> None:
        """Arguments as for :class:`Rollout`, with sync clients and releaser.

        Raises:
            ConfigError: a bad URL or id, or both ``releaser`` and ``release_policy``.
        """
        super().__init__(
            router_url,
            session_id=session_id,
            prefix=prefix,
            api_key=api_key,
            release=release,
            header=header,
            releaser=releaser,
            release_policy=release_policy,
            openai_kwargs=openai_kwargs,
            httpx_kwargs=httpx_kwargs,
        )
        self._releaser = releaser
        self._openai_base = openai_client
        self._owns_openai = openai_client is None
        self._httpx: httpx.Client | None = None
        self._lock = threading.Lock()

    @property
    def openai(self) -> OpenAI:
        """An ``OpenAI`` client whose requests carry the current session id.

        Raises:
            RolloutClosedError: the rollout is closed.
            ImportError: the ``openai`` package is not installed.
        """
        self._check_open()
        if self._openai_base is None:
            self._openai_base = session_openai(
                self.router_url,
                self.session_id,
                api_key=self.api_key,
                header=self.header,
                **self._openai_kwargs,
            )
        return self._bind(self._openai_base)

    @property
    def httpx(self) -> httpx.Client:
        """An ``httpx.Client`` (base URL: the router) tagging every request with the id.

        Raises:
            RolloutClosedError: the rollout is closed.
        """
        self._check_open()
        if self._httpx is None:
            self._httpx = session_httpx_client(self._ids, header=self.header, **self._httpx_kwargs)
        return self._httpx

    def close(self) -> None:
        """Release every id (if enabled) and close the clients made here; exactly once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            ids = self._ids_to_release()
            if ids:
                releaser = self._releaser or SyncSessionReleaser(
                    self.router_url, policy=self._release_policy, api_key=self.api_key
                )
                try:
                    releaser.finish_sessions(ids)
                finally:
                    if self._releaser is None:
                        _close_quietly("releaser", releaser.close)
        finally:
            if self._httpx is not None:
                _close_quietly("httpx client", self._httpx.close)
            if self._owns_openai and self._openai_base is not None:
                _close_quietly("openai client", self._openai_base.close)

    def __enter__(self) -> SyncRollout:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
