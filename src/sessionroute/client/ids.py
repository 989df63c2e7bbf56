"""Session ids on the client side: minting, validating, and the per-rollout id log.

A rollout keeps one id for all of its turns (and for every retry of a turn), so a sticky router
keeps the growing conversation on the replica that holds its prefix cache. When a rollout throws
away a trajectory and starts over, it *rotates* to a fresh id; the old one stays in the log so it
can still be released when the rollout ends.
"""

from __future__ import annotations

import uuid

from sessionroute.errors import ConfigError

__all__ = ["SESSION_HEADER", "SessionIds", "new_session_id", "router_root", "validate_session_id"]

SESSION_HEADER = "x-session-id"
"""The header the router reads a session id from by default (``shared/ROUTER.md``)."""


def new_session_id(prefix: str = "") -> str:
    """A fresh random session id: ``prefix`` followed by 32 hex digits of a uuid4.

    Args:
        prefix: printable text to put in front (e.g. ``"rollout-17-"``), or empty.

    Raises:
        ConfigError: ``prefix`` contains characters not allowed in a header value.
    """
    return validate_session_id(f"{prefix}{uuid.uuid4().hex}")


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged if it can travel in an HTTP header, else raise.

    Args:
        session_id: a non-empty string of printable ASCII (0x20-0x7e) with no leading or trailing
            space; the router matches it exactly, so nothing is normalised.

    Raises:
        ConfigError: the id is empty, not a string, or has other characters.
    """
    ok = (
        isinstance(session_id, str)
        and session_id != ""
        and session_id == session_id.strip()
        and all(" " <= ch <= "~" for ch in session_id)
    )
    if not ok:
        raise ConfigError(
            f"session_id must be non-empty printable ASCII without surrounding spaces, "
            f"got {session_id!r}"
        )
    return session_id


def router_root(router_url: str) -> str:
    """The router's root URL: ``router_url`` without a trailing ``/`` or ``/v1``.

    Both ``http://host:30000`` and ``http://host:30000/v1/`` (an OpenAI ``base_url``) give
    ``http://host:30000``; ``/finish_session`` and ``/v1/...`` are resolved against it.

    Raises:
        ConfigError: the URL is not ``http://`` or ``https://``.
    """
    if not isinstance(router_url, str) or not router_url.startswith(("http://", "https://")):
        raise ConfigError(f"router_url must start with http:// or https://, got {router_url!r}")
    root = router_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root


class SessionIds:
    """The ids one rollout has used: the current one plus every earlier (discarded) one.

    Not thread-safe; one rollout lives on one event loop or one thread.

    Attributes:
        prefix: the prefix given to ids this log mints.
    """

    def __init__(self, session_id: str | None = None, *, prefix: str = "") -> None:
        """Start the log with ``session_id``, or a fresh :func:`new_session_id` if None.

        Raises:
            ConfigError: ``session_id`` or ``prefix`` is not a valid header value.
        """
        self.prefix = prefix
        first = new_session_id(prefix) if session_id is None else validate_session_id(session_id)
        self._all: dict[str, None] = {first: None}
        self._current = first

    @property
    def current(self) -> str:
        """The id requests are tagged with now."""
        return self._current

    @property
    def all(self) -> tuple[str, ...]:
        """Every id used so far, in first-use order, the current one included."""
        return tuple(self._all)

    def rotate(self) -> str:
        """Mint a fresh id, make it current and return it; the old one stays in :attr:`all`."""
        self._current = new_session_id(self.prefix)
        self._all[self._current] = None
        return self._current

    def adopt(self, session_id: str) -> None:
        """Record an id that a request carried by hand, so it is released with the others.

        Empty ids are ignored; others are recorded as sent (the server saw them as they are).
        """
        if session_id and session_id not in self._all:
            self._all[session_id] = None
