"""sessionroute.client: tag a rollout's requests with its session id and release it at the end.

Start with :class:`Rollout` (async) or :class:`SyncRollout`; the pieces underneath (id log,
httpx hooks, OpenAI client helpers, the bounded releaser) are exported for code that manages its
own clients. See ``docs/client.md``.
"""

from sessionroute.client.binding import (
    async_session_hook,
    session_async_httpx_client,
    session_async_openai,
    session_hook,
    session_httpx_client,
    session_openai,
    with_session,
)
from sessionroute.client.ids import (
    SESSION_HEADER,
    SessionIds,
    new_session_id,
    router_root,
    validate_session_id,
)
from sessionroute.client.release import (
    ReleasePolicy,
    SessionReleaser,
    SyncSessionReleaser,
    resolve_release,
)
from sessionroute.client.rollout import Rollout, RolloutClosedError, SyncRollout

__all__ = [
    "SESSION_HEADER",
    "ReleasePolicy",
    "Rollout",
    "RolloutClosedError",
    "SessionIds",
    "SessionReleaser",
    "SyncRollout",
    "SyncSessionReleaser",
    "async_session_hook",
    "new_session_id",
    "resolve_release",
    "router_root",
    "session_async_httpx_client",
    "session_async_openai",
    "session_hook",
    "session_httpx_client",
    "session_openai",
    "validate_session_id",
    "with_session",
]
