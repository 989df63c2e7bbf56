"""Frozen request and decision views shared by policies, the simulator and the server.

:class:`RouteRequest` and :class:`Decision` are created once per routed request, so they are
compiled classes with ``Final`` fields and their own ``__init__`` (``dataclass(init=False)``
adds comparison, hashing and ``repr``): immutable once compiled (assignment raises
``AttributeError``), same constructors and field names as frozen dataclasses, at about 1/25 of
their creation cost (a frozen dataclass sets each field through ``object.__setattr__``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Decision", "DecisionKind", "EngineGauges", "RouteRequest"]


@dataclass(init=False, slots=True, unsafe_hash=True)
class RouteRequest:
    """What a policy may look at when it places one request.

    Attributes:
        session_id: the session (rollout, conversation) id, or None for a stateless request.
        prompt_tokens: size estimate of the prompt in tokens (0 when unknown).
        text: prompt text, only for content-aware policies in the live router.
        tokens: token ids or block ids of the prompt, for content-aware policies in the
            simulator (block ids are one id per KV block).
        model: the requested model name, if any.
        request_id: the per-request id (for logs), if any.
        session_header: lower-case name of the header the session id came from; part of the
            ``consistent_hash`` key (``header:<name>:<value>``) for parity with vllm-router.
    """

    session_id: Final[str | None]
    prompt_tokens: Final[int]
    text: Final[str | None]
    tokens: Final[Sequence[int] | None]
    model: Final[str | None]
    request_id: Final[str | None]
    session_header: Final[str]

    def __init__(
        self,
        session_id: str | None = None,
        prompt_tokens: int = 0,
        text: str | None = None,
        tokens: Sequence[int] | None = None,
        model: str | None = None,
        request_id: str | None = None,
        session_header: str = "x-session-id",
    ) -> None:
        self.session_id = session_id
        self.prompt_tokens = prompt_tokens
        self.text = text
        self.tokens = tokens
        self.model = model
        self.request_id = request_id
        self.session_header = session_header


class DecisionKind(enum.Enum):
    """How a routing decision was reached (exported as ``decisions_total{kind=...}``)."""

    NEW = "new"
    """A session seen for the first time (or after expiry/release) was placed."""
    STICKY = "sticky"
    """A known session went to its pinned worker."""
    REPINNED = "repinned"
    """A known session's worker was unhealthy or removed, so it was placed elsewhere."""
    STATELESS = "stateless"
    """The request carried no session (or the policy keeps no session state)."""


@dataclass(init=False, slots=True, unsafe_hash=True)
class Decision:
    """The result of :meth:`sessionroute.router.policies.Policy.select`.

    Attributes:
        worker: the chosen worker id (its URL).
        kind: how it was chosen.
    """

    worker: Final[str]
    kind: Final[DecisionKind]

    def __init__(self, worker: str, kind: DecisionKind) -> None:
        self.worker = worker
        self.kind = kind


@dataclass(init=False, slots=True, unsafe_hash=True)
class EngineGauges:
    """Engine-side load signals scraped from a replica's ``/metrics`` (vLLM names).

    Attributes:
        running: ``vllm:num_requests_running``.
        waiting: ``vllm:num_requests_waiting``.
        kv_usage: ``vllm:kv_cache_usage_perc`` in [0, 1].
    """

    running: Final[int]
    waiting: Final[int]
    kv_usage: Final[float]

    def __init__(self, running: int = 0, waiting: int = 0, kv_usage: float = 0.0) -> None:
        self.running = running
        self.waiting = waiting
        self.kv_usage = kv_usage

    def same(self, other: EngineGauges | None) -> bool:
        """``self == other`` read field by field (compiled; the dataclass ``__eq__`` is
        interpreted code)."""
        return (
            other is not None
            and self.running == other.running
            and self.waiting == other.waiting
            and self.kv_usage == other.kv_usage
        )
