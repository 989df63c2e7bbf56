"""Frozen request and decision views shared by policies, the router core and its drivers."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "Decision",
    "DecisionKind",
    "EngineGauges",
    "RouteRequest",
]


class RouteRequest(NamedTuple):
    """What a policy may look at when it places one request.

    Built by :class:`sessionroute.router.requests.RequestBuilder`, from an HTTP request in
    ``serve`` and from a simulated turn in ``sim``, so a policy sees the same thing in both.

    Attributes:
        session_id: the session (rollout, conversation) id, or None for a stateless request.
        prompt_tokens: size estimate of the prompt in tokens (0 when unknown); see
            :func:`sessionroute.router.requests.estimate_prompt_tokens`.
        blocks: chained prefix keys of the prompt, one 64-bit int per content block of
            ``RouterConfig.content_block_tokens`` tokens (key ``i`` identifies blocks ``0..i``);
            None unless the policy reads content (``Policy.needs_content``).
        model: the requested model name, if known.
        request_id: the per-request id (for logs and tie-breaks), if any.
        session_header: lower-case name of the header the session id came from; part of the
            ``consistent_hash`` key (``header:<name>:<value>``) for parity with vllm-router.
        stream: the client asked for a streamed answer (``"stream": true``); the live
            router's first-byte timeout applies only to these.
        cache_salt: the request's prefix-cache namespace (vLLM's ``cache_salt``), or None;
            set only for policies that read content.

    Immutable and hashable (while ``blocks`` is None or a tuple): a ``typing.NamedTuple``,
    built once per request and attempt (proxy and simulator), which is cheaper to build than a
    frozen dataclass. Derive a changed copy with ``request._replace(field=...)``.
    """

    session_id: str | None = None
    prompt_tokens: int = 0
    blocks: Sequence[int] | None = None
    model: str | None = None
    request_id: str | None = None
    session_header: str = "x-session-id"
    stream: bool = False
    cache_salt: str | None = None


class DecisionKind(enum.StrEnum):
    """How a routing decision was reached (exported as ``decisions_total{kind=...}``).

    A ``StrEnum``: a kind is its label, and hashing one (the router core counts decisions by
    kind on every request) is a string hash, where a plain ``Enum`` member runs Python code.
    """

    NEW = "new"
    """A session seen for the first time (or after expiry/release) was placed."""
    STICKY = "sticky"
    """A known session went to its pinned worker."""
    REPINNED = "repinned"
    """A known session's worker was unhealthy or removed, so it was placed elsewhere."""
    STATELESS = "stateless"
    """The request carried no session (or the policy keeps no session state)."""
    MOVED = "moved"
    """A known session left its healthy worker because the policy moved it off an overloaded
    one (``adaptive_sticky``'s escape)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of :meth:`sessionroute.router.policies.Policy.select`.

    Attributes:
        worker: the chosen worker id (its URL).
        kind: how it was chosen.
    """

    worker: str
    kind: DecisionKind


class EngineGauges(NamedTuple):
    """Engine-side load signals scraped from a replica's ``/metrics`` (vLLM names).

    Attributes:
        running: ``vllm:num_requests_running``.
        waiting: ``vllm:num_requests_waiting``.
        kv_usage: ``vllm:kv_cache_usage_perc`` in [0, 1].

    A ``typing.NamedTuple`` like :class:`RouteRequest`: built per scrape and replica (in the
    simulator too, every scrape interval), and compared with the previous scrape's, both
    cheaper than for a frozen dataclass.
    """

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
