"""The contract between a workload and whatever drives it (the simulator, or a live client).

A workload emits *sessions*: sequences of :class:`Turn` requests whose content identity is real
(chained block keys, :mod:`sessionroute.workloads.content`). It reacts to responses through the
:class:`Host` it is started with; the host owns time, routing, replicas and metrics. Workloads
are pure: time comes from ``host.now()``, randomness from the ``numpy.random.Generator`` they are
built with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

__all__ = ["Host", "SessionEnd", "Turn", "TurnOutcome", "Workload", "WorkloadConfig"]

SessionEnd = Literal["completed", "cancelled"]
"""How a session ended: ``completed`` (done, failed or hit the context limit) or ``cancelled``
(timeout, off-policy bound, or abandoned)."""


class Turn(NamedTuple):
    """One request of a session (immutable; a ``NamedTuple`` rather than a frozen dataclass,
    whose ``__init__`` costs about twice as much, and one is built per request).

    Attributes:
        session_id: the session key sent in the session header (rollout id, conversation or
            thread id).
        prompt_len: prompt tokens (>= 1).
        output_len: tokens to generate, forced (>= 1).
        block_keys: chained keys of the full blocks of prompt + output at the host's
            ``block_size`` (:mod:`sessionroute.keys`; see
            :class:`sessionroute.replica.EngineRequest`); at least ``prompt_len // block_size``
            of them. A list is used as it is, not copied: its keys must not change, nor may it
            grow while the turn is in flight; a session may extend the same list for its next
            turn after this one ended (the simulated replicas keep it for cached blocks and
            only read this turn's keys).
        cache_salt: prefix-cache namespace (e.g. the policy version of an RL rollout), or None.
        tag: opaque workload data, handed back in the :class:`TurnOutcome`.
    """

    session_id: str
    prompt_len: int
    output_len: int
    block_keys: Sequence[int]
    cache_salt: str | None = None
    tag: Any = None


class TurnOutcome(NamedTuple):
    """What the client saw of one :class:`Turn` (immutable, one per request, as :class:`Turn`).

    Attributes:
        turn: the turn.
        sent_s: when the client sent it (seconds, simulated).
        done_s: when the client got the last token (or the rejection), seconds.
        ok: False when the request was rejected (longer than the replicas' ``max_model_len``).
        cached_tokens: prefix-cache hit tokens at its final admission (0 if rejected).
        replica: index of the replica that served it (-1 if rejected).
    """

    turn: Turn
    sent_s: float
    done_s: float
    ok: bool
    cached_tokens: int
    replica: int


class Host(Protocol):
    """What a workload may ask of its driver (the simulator, or the live host)."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block of the replicas (the key granularity of :attr:`Turn.block_keys`)."""
        ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output the replicas accept, in tokens."""
        ...

    def now(self) -> float:
        """Current time in seconds."""
        ...

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at time ``t`` seconds (``t >= now()``)."""
        ...

    def submit(self, turn: Turn, on_done: Callable[[TurnOutcome], None]) -> int:
        """Send ``turn`` now; ``on_done`` is called once when its response has arrived (not if
        the turn is cancelled first). Returns a handle for :meth:`cancel`."""
        ...

    def cancel(self, handle: int) -> None:
        """Abort an in-flight turn (no-op if it already finished); ``on_done`` is not called."""
        ...

    def end_session(self, session_id: str, how: SessionEnd) -> None:
        """The session is over: record it and release it at the router (``/finish_session``)
        when the run releases sessions."""
        ...

    def reset_prefix_cache(self) -> None:
        """Drop every cached-idle block on every replica (weight update with ``cache="reset"``)."""
        ...

    def record_step(self, step: int, step_time_s: float) -> None:
        """An RL trainer step ``step`` (1-based) ended now after ``step_time_s`` seconds."""
        ...

    def record_group(self, latency_s: float) -> None:
        """A GRPO group ended; ``latency_s`` is admission to its slowest rollout's end."""
        ...

    def stop(self) -> None:
        """The workload is done: end the run after the current event."""
        ...


class Workload(Protocol):
    """A running workload (built from a :class:`WorkloadConfig`)."""

    def start(self, host: Host) -> None:
        """Schedule the first sessions on ``host``."""
        ...

    def progress(self) -> float:
        """Fraction done in [0, 1]."""
        ...

    def summary(self) -> dict[str, Any]:
        """Workload-specific counters, merged into the run's metrics (JSON-serializable)."""
        ...


class WorkloadConfig(Protocol):
    """A validated workload configuration (pydantic model) that builds a :class:`Workload`."""

    kind: str

    def build(self, rng: Any) -> Workload:
        """A fresh workload drawing randomness from ``rng`` (a ``numpy.random.Generator``)."""
        ...

    def model_dump(self) -> dict[str, Any]:
        """Every option, resolved (for the run's record)."""
        ...
