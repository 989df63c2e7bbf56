"""``trajectory_admission``: ThunderAgent-style pausing of agent sessions between turns.

Source: the Dynamo ThunderAgent router (ai-dynamo docs ``agents/thunderagent-router``; arXiv
2602.13692; summary in ``shared/POLICIES.md``). An agent program (here: a session) alternates
model turns and tool calls; while it is in a tool call its KV cache is idle but still wanted.
Per worker, the router tracks the *working set* — the context tokens of the active sessions
pinned there — over the worker's KV capacity (``fill``):

* **pause**: when a worker's fill reaches ``pause_threshold`` (0.95), sessions pinned there
  that are between turns (no request in flight) are paused, smallest first, until the fill is
  at most ``pause_target`` (0.80). A paused session leaves the working set; its next turn is
  held in the router's admission queue (:meth:`admit` returns False).
* **resume**: a held turn is admitted once its worker's fill *with the session back* is
  below ``pause_threshold - resume_gap`` (0.85: hysteresis), or once the session has been
  paused for ``max_pause_s`` (1,800 s, forced resume). Waiting turns are re-examined every
  ``check_interval_s`` (5 s) of router time and whenever load changes; turns of other
  sessions are never held behind them.
* **placement**: a new session goes to the worker with the lowest fill (least working set);
  then it stays there (sticky, like ``sticky_least_loaded``, with the same TTL and sweeps).

A session's context is the prompt-token estimate of its latest turn. The KV capacity is
``kv_capacity_tokens`` when set; otherwise it is estimated per worker from its scraped gauges
as in-flight prompt tokens / KV usage (smoothed; only while the usage is at least 0.2) — until
such an estimate exists the fill is 0 and nothing is paused.

Reproduced: the working set over capacity, the 0.95 / 0.80 / 0.85 bands, pausing only
between turns, smallest first, forced resume at 1,800 s, the 5 s check, least-working-set
placement. Approximated or guessed: the priority lowering between 0.80 and 0.95 is not
reproduced; resumes go in the order the held turns arrived (not smallest first, though a
smaller session fits under the band sooner); the fill a resume must stay under counts the
resumed session (so one paused down to 0.80 does not bounce straight back); the
capacity estimate above (ThunderAgent knows each engine's KV pool); new sessions are never
held. A held turn also obeys the router's ``admission_max_wait_s``: past it the client gets a
503 and sends the turn again (the pause itself continues).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._pick import LowestScore
from sessionroute.router.policies._sessions import SessionPolicy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
)
from sessionroute.types import Decision, EngineGauges, RouteRequest

__all__ = ["TrajectoryAdmissionConfig", "TrajectoryAdmissionPolicy"]

_MIN_USAGE_FOR_ESTIMATE = 0.2
_ESTIMATE_WEIGHT = 0.2  # weight of a new capacity estimate in the moving average


@dataclass(frozen=True, slots=True)
class TrajectoryAdmissionConfig:
    """Options of ``trajectory_admission``.

    Attributes:
        pause_threshold: fill, in (0, 1], at which between-turn sessions are paused.
        pause_target: fill, in [0, pause_threshold], down to which sessions are paused.
        resume_gap: held turns resume below ``pause_threshold - resume_gap``.
        max_pause_s: seconds after which a paused session resumes regardless.
        check_interval_s: seconds between re-examinations of held turns by time alone.
        kv_capacity_tokens: every worker's KV capacity in tokens (None: estimated from
            gauges).
        session_ttl_s: idle seconds before a session expires.
        sweep_interval_s: minimum seconds between sweeps run inside ``select``.
        max_sessions: capacity of the session table.
        session_table_max_bytes: capacity of the session table in estimated bytes
            (``SessionTable``'s ``max_bytes``; the router's ``RouterConfig`` gives its own).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    pause_threshold: float = 0.95
    pause_target: float = 0.80
    resume_gap: float = 0.10
    max_pause_s: float = 1800.0
    check_interval_s: float = 5.0
    kv_capacity_tokens: int | None = None
    session_ttl_s: float = DEFAULT_TTL_S
    sweep_interval_s: float = 60.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_table_max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if not 0.0 < self.pause_threshold <= 1.0:
            raise ConfigError(f"pause_threshold must be in (0, 1], got {self.pause_threshold!r}")
        if not 0.0 <= self.pause_target <= self.pause_threshold:
            raise ConfigError(
                f"pause_target must be in [0, pause_threshold], got {self.pause_target!r}"
            )
        if not 0.0 <= self.resume_gap <= self.pause_threshold:
            raise ConfigError(
                f"resume_gap must be in [0, pause_threshold], got {self.resume_gap!r}"
            )
        for name in ("max_pause_s", "sweep_interval_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.check_interval_s > 0:
            raise ConfigError(f"check_interval_s must be > 0, got {self.check_interval_s!r}")
        cap = self.kv_capacity_tokens
        if cap is not None and cap < 1:
            raise ConfigError(f"kv_capacity_tokens must be >= 1 or None, got {cap!r}")


class TrajectoryAdmissionPolicy(SessionPolicy):
    """Sticky sessions placed by least working set; between-turn sessions paused at the KV
    high band and resumed below the low band (module docstring).

    Attributes:
        paused: paused session id -> the router time it was paused.
        stats: ``"paused"``, ``"resumed"`` (below the band) and ``"forced"`` (max pause).
    """

    name: ClassVar[str] = "trajectory_admission"
    Config: ClassVar[type[Any] | None] = TrajectoryAdmissionConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: TrajectoryAdmissionConfig = self.config
        self.admission_recheck_s = cfg.check_interval_s
        self._resume_below = cfg.pause_threshold - cfg.resume_gap
        self._ctx: dict[str, int] = {}  # session -> context tokens (its latest prompt)
        self._home: dict[str, str] = {}  # session -> worker whose working set counts it
        self._on: dict[str, set[str]] = {}  # worker -> sessions homed there
        self._ws: dict[str, int] = {}  # worker -> working set (active sessions' tokens)
        self._busy: dict[str, int] = {}  # session -> requests in flight
        self._cap: dict[str, float] = {}  # worker -> estimated KV capacity (tokens)
        self._seen: dict[str, EngineGauges] = {}  # worker -> gauges of the last estimate
        self.paused: dict[str, float] = {}
        self.stats: dict[str, int] = {"paused": 0, "resumed": 0, "forced": 0}
        self._picker = LowestScore()
        self.table.on_drop = self._dropped  # expired or evicted: forget (unless in flight)

    # -- signals --------------------------------------------------------------------------
    def capacity(self, worker: str, cluster: ClusterView) -> float | None:
        """KV capacity of ``worker`` in tokens: configured, or estimated (None: unknown).

        Folds the worker's current gauges into the estimate (a cache of what was observed;
        it changes no decision state)."""
        fixed = self.config.kv_capacity_tokens
        if fixed is not None:
            return float(fixed)
        g = cluster.gauges(worker)
        if g is not None and self._seen.get(worker) is not g:
            self._seen[worker] = g
            tokens = cluster.in_flight_tokens(worker)
            if g.kv_usage >= _MIN_USAGE_FOR_ESTIMATE and tokens > 0:
                est = tokens / g.kv_usage
                old = self._cap.get(worker)
                self._cap[worker] = est if old is None else old + _ESTIMATE_WEIGHT * (est - old)
        return self._cap.get(worker)

    def fill(self, worker: str, cluster: ClusterView) -> float:
        """Working set of ``worker`` over its KV capacity (0 while the capacity is unknown)."""
        cap = self.capacity(worker, cluster)
        return 0.0 if cap is None else self._ws.get(worker, 0) / cap

    # -- admission ------------------------------------------------------------------------
    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        sid = request.session_id
        if sid is None:
            return True
        since = self.paused.get(sid)
        if since is None:
            return True
        if self.clock.now() - since >= self.config.max_pause_s:
            return True
        home = self._home.get(sid)
        if home is None or not cluster.is_healthy(home):
            return True
        cap = self.capacity(home, cluster)
        back = self._ws.get(home, 0) + self._ctx.get(sid, 0)
        return cap is None or back < self._resume_below * cap

    # -- placement ------------------------------------------------------------------------
    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The worker with the lowest fill (working set when no capacity is known)."""
        known = all(self.capacity(w, cluster) is not None for w in healthy)
        if known:
            scores = [self.fill(w, cluster) for w in healthy]
        else:
            scores = [float(self._ws.get(w, 0)) for w in healthy]
        return self._picker.pick(healthy, scores)

    def place_stateless(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """Requests without a session: the same least-working-set choice."""
        return self.place_new(request, healthy, cluster)

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        decision = super().select(request, cluster)
        sid = request.session_id
        if sid is None:
            return decision
        worker = decision.worker
        since = self.paused.pop(sid, None)
        if since is not None:
            forced = self.clock.now() - since >= self.config.max_pause_s
            self.stats["forced" if forced else "resumed"] += 1
        else:
            self._unhome(sid)
        self._home[sid] = worker
        self._on.setdefault(worker, set()).add(sid)
        tokens = request.prompt_tokens
        self._ctx[sid] = tokens
        self._ws[worker] = self._ws.get(worker, 0) + tokens
        self._busy[sid] = self._busy.get(sid, 0) + 1
        self._maybe_pause(worker, cluster)
        return decision

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        sid = request.session_id
        if sid is None:
            return
        n = self._busy.get(sid, 0) - 1
        if n > 0:
            self._busy[sid] = n
        else:
            self._busy.pop(sid, None)
            if self.table.worker_of(sid) is None:  # its pin went while it was in flight
                self._forget(sid)

    def _maybe_pause(self, worker: str, cluster: ClusterView) -> None:
        """Pause between-turn sessions on ``worker``, smallest first, when it is over the
        pause threshold, down to the pause target."""
        cfg: TrajectoryAdmissionConfig = self.config
        cap = self.capacity(worker, cluster)
        if cap is None or self._ws.get(worker, 0) < cfg.pause_threshold * cap:
            return
        target = cfg.pause_target * cap
        idle = sorted((self._ctx[s], s) for s in self._on.get(worker, ()) if s not in self._busy)
        now = self.clock.now()
        for _tokens, sid in idle:
            if self._ws[worker] <= target:
                break
            self._unhome(sid)
            self.paused[sid] = now
            self._home[sid] = worker  # resumes there; no longer in the working set
            self.stats["paused"] += 1

    def _unhome(self, sid: str) -> None:
        """Take ``sid`` out of its worker's working set (it stays known)."""
        home = self._home.pop(sid, None)
        if home is None:
            return
        members = self._on.get(home)
        if members is not None and sid in members:
            members.discard(sid)
            left = self._ws.get(home, 0) - self._ctx.get(sid, 0)
            self._ws[home] = left if left > 0 else 0

    def _forget(self, sid: str) -> None:
        if sid not in self.paused:
            self._unhome(sid)
        self._home.pop(sid, None)
        self.paused.pop(sid, None)
        self._ctx.pop(sid, None)
        self._busy.pop(sid, None)

    # -- lifecycle ------------------------------------------------------------------------
    def release_session(self, session_id: str) -> bool:
        known = super().release_session(session_id)
        self._forget(session_id)
        return known

    def _dropped(self, sid: str) -> None:
        """The session table dropped ``sid`` (expired, evicted): forget it, unless a request
        of it is in flight (then when that completes, :meth:`on_complete`)."""
        if sid not in self._busy:
            self._forget(sid)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        """O(1): the worker's working set goes; its sessions' homes point at a worker that is
        no longer there (not healthy: their held turns are admitted, and their next turn
        re-places them)."""
        super().on_worker_removed(worker, cluster)
        self._on.pop(worker, None)
        self._ws.pop(worker, None)
        self._cap.pop(worker, None)
        self._seen.pop(worker, None)
        self._picker.forget(worker)
