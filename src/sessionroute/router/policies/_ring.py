"""A consistent-hash ring with vllm-router's point layout (shared by two policies).

Each worker contributes :data:`POINTS_PER_WORKER` points ``fbi_hash("<url>:<i>")``; a key goes
to the first point ``>= fbi_hash(key)``, wrapping around (vllm-router ``consistent_hash``,
``shared/ROUTER.md``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

from sessionroute.router.policies._rendezvous import fbi_hash_many
from sessionroute.router.policies.hashing import fbi_hash

__all__ = [
    "BODY_PREFIX",
    "POINTS_PER_WORKER",
    "VLLM_ROUTER_BODY_FIELD",
    "HashRing",
    "KeyHashCache",
    "ring_key",
]

POINTS_PER_WORKER: Final = 160
"""Virtual nodes per worker, as in vllm-router."""


class KeyHashCache:
    """Memoizes ``fbi_hash(key)`` (a pure-Python hash of ~25 us) for recurring session keys.

    Args:
        capacity: entries kept; past it the oldest entry is evicted for each new one (O(1),
            so a full cache never stalls the event loop: clearing a million entries at once
            took ~30 ms).
    """

    __slots__ = ("_cache", "_capacity")

    def __init__(self, capacity: int = 1 << 20) -> None:
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, key: str) -> int:
        cache = self._cache
        h = cache.get(key)
        if h is None:
            if len(cache) >= self._capacity:
                cache.popitem(last=False)
            h = cache[key] = fbi_hash(key)
        return h


class HashRing:
    """The ring over a set of workers; rebuilt when the set changes."""

    __slots__ = ("_owners", "_point_cache", "_points", "members")

    def __init__(self) -> None:
        self._point_cache: dict[str, list[int]] = {}
        self._points: list[int] = []
        self._owners: list[str] = []
        self.members: tuple[str, ...] = ()

    def _worker_points(self, url: str) -> list[int]:
        pts = self._point_cache.get(url)
        if pts is None:
            pts = fbi_hash_many([f"{url}:{i}".encode() for i in range(POINTS_PER_WORKER)])
            self._point_cache[url] = pts
        return pts

    def rebuild(self, members: tuple[str, ...]) -> None:
        """Make the ring hold exactly ``members`` (cheap when unchanged)."""
        if members == self.members:
            self.members = members
            return
        pairs = sorted((p, url) for url in members for p in self._worker_points(url))
        self._points = [p for p, _ in pairs]
        self._owners = [u for _, u in pairs]
        self.members = members

    def owner(self, h: int) -> str:
        """The worker owning hash ``h`` (first point >= h, wrapping). IndexError if empty."""
        i = bisect_left(self._points, h)
        if i == len(self._points):
            i = 0
        return self._owners[i]

    def walk(self, h: int) -> Iterator[str]:
        """Distinct workers in ring order starting at the owner of ``h``."""
        n = len(self._points)
        if not n:
            return
        start = bisect_left(self._points, h)
        seen: set[str] = set()
        for j in range(n):
            url = self._owners[(start + j) % n]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) == len(self.members):
                    return


VLLM_ROUTER_BODY_FIELD = "session_params.session_id"
"""The body field vllm-router 0.1.17 reads (hashed as ``request:<id>``)."""

BODY_PREFIX = "body:"
"""Prefix of a body field's origin label (``RouteRequest.session_header``), e.g.
``body:prompt_cache_key``; a header's label is its lower-case name."""


def ring_key(label: str, session_id: str) -> str:
    """The string ``consistent_hash`` hashes for a session id from ``label``: vllm-router's
    ``header:<name>:<id>`` for a header, ``request:<id>`` for ``session_params.session_id``,
    ``body:<field>:<id>`` for another body field."""
    if label.startswith(BODY_PREFIX):
        if label == BODY_PREFIX + VLLM_ROUTER_BODY_FIELD:
            return "request:" + session_id
        return f"{label}:{session_id}"
    return f"header:{label}:{session_id}"
