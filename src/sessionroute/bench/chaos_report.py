"""The accounting of ``sessionroute bench chaos``: what happened to every session, turn and
failed attempt, explained by the faults that were running, and the table.

A failed attempt is *explained* when its interval overlaps a fault's window (from the signal
to the child answering again, plus ``GRACE_S`` for health checks and circuits to catch up):
``router restart`` when it went to the restarted router, else ``replica crash``, ``replica
freeze``, ``replica slowed`` or ``redis restart``. Anything else is ``unexplained``. A worker
change between two consecutive turns of a session (a *move*) is explained by a crash or freeze
of the worker it left, then by the routers disagreeing on a worker (the worker it
left unavailable to the router that moved it, or the worker it went to unavailable to the
other router: a circuit open or health checks failing on one router only, as each router
judges workers on its own), then by a Redis outage, last by a slowdown of the worker it left
(no reason for a sticky policy to move a session: worth a look); a move back to a worker the
session had left is a *flap*, the sign of two routers answering a session from two workers
at once.
For a slowdown, the sessions placed while it lasted are counted per worker (the router should
place new sessions away from the slow one by load, and fail nothing).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sessionroute.bench.chaos_load import Attempt, SessionLog

__all__ = ["GRACE_S", "account", "print_table"]

WATCH_S = 1.0
"""Seconds a router's unavailable span is stretched back (it is sampled every 0.5 s)."""

GRACE_S = 15.0
"""Seconds after a fault's end that failures and moves are still put down to it."""

_LABEL = {
    "router_restart": "router restart",
    "replica_crash": "replica crash",
    "replica_freeze": "replica freeze",
    "replica_slow": "replica slowed",
    "redis_restart": "redis restart",
}


_PROBLEMS = ("unexplained", "redis restart: pin not restored", "replica slowed")
"""Move causes whose sessions' traces are kept first: those that fail the run, and moves off
a slowed replica (a sticky policy should keep them)."""


def _covers(fault: dict[str, Any], start: float, end: float) -> bool:
    return bool(start <= fault["end_s"] + GRACE_S and end >= fault["start_s"])


def _cause(a: Attempt, faults: list[dict[str, Any]]) -> str:
    live = [f for f in faults if _covers(f, a.start, a.end)]
    for f in live:
        if f["kind"] == "router_restart" and f["target"] == a.router:
            return _LABEL["router_restart"]
    for kind in ("replica_crash", "replica_freeze", "redis_restart", "replica_slow"):
        if any(f["kind"] == kind for f in live):
            return _LABEL[kind]
    return "unexplained"


def _move_cause(
    left: int | None,
    before: float,
    answered: float,
    log: SessionLog,
    faults: list[dict[str, Any]],
    routers: int,
    down: dict[tuple[int, int | None], list[list[Any]]],
    router: int,
    to: int | None,
) -> str:
    """The fault that explains a move off worker ``left`` between a turn answered at
    ``before`` and the next one answered at ``answered``. The window runs to the answer, not
    the send: the router may retry an attempt on another worker when its worker dies after
    the request went out.

    Over a Redis outage the move is put down to what the routers knew when Redis went away
    (the routers that had answered a turn of the session): both of them, a *pin not
    restored* (a fault of the router); one of them, a *pin known to one router only* (the
    other cannot know it without Redis); none, a *session begun during the outage* (the
    routers place it alike by rendezvous, except while one has reconnected and the other
    not yet)."""
    live = [f for f in faults if _covers(f, before, answered)]
    for f in live:
        if f["kind"] in ("replica_crash", "replica_freeze") and f["target"] == left:
            return _LABEL[f["kind"]]
    others = [(r, w) for r, w in down if r != router and w == to]
    for key in [(router, left), *others]:  # left unavailable here, or its new worker there
        for lo, hi, reason in down.get(key, []):
            if lo <= answered and hi >= before - WATCH_S:
                return f"routers disagree on a worker ({reason} on one)"
    for f in live:
        if f["kind"] == "redis_restart":
            knew = {a.router for a in log.attempts if a.ok and a.start < f["start_s"]}
            if len(knew) >= routers:
                return "redis restart: pin not restored"
            if knew:
                return "redis outage: pin known to one router only"
            return "redis outage: session begun during it"
    for f in live:  # last: a slow worker is no reason for a sticky policy to move a session
        if f["kind"] == "replica_slow" and f["target"] == left:
            return _LABEL[f["kind"]]
    return "unexplained"


def _placed(logs: list[SessionLog], fault: dict[str, Any], worker_index: Any) -> dict[str, int]:
    """Sessions whose first answer was sent while ``fault`` lasted, per worker index."""
    placed: Counter[str] = Counter()
    for s in logs:
        first = next((a for a in s.attempts if a.ok), None)
        if first is not None and fault["start_s"] <= first.start <= fault["end_s"]:
            placed[str(worker_index(first.worker))] += 1
    return dict(sorted(placed.items()))


def account(
    logs: list[SessionLog],
    faults: list[dict[str, Any]],
    worker_index: Any,
    routers: int = 2,
    down: dict[tuple[int, int | None], list[list[Any]]] | None = None,
) -> dict[str, Any]:
    """Sessions, turns, attempts, errors by cause, moves by cause, flaps.

    ``worker_index`` maps a worker URL (the router's header) to a replica index or None;
    ``routers``: how many routers the turns went through; ``down``: (router, replica index)
    -> ``[start, end, reason]`` spans during which that router held the replica unavailable
    (:mod:`sessionroute.bench.chaos_watch`).
    """
    down = down or {}
    states = Counter(s.state for s in logs)
    errors: Counter[str] = Counter()
    details: dict[str, Counter[str]] = {}
    moves: Counter[str] = Counter()
    flaps: Counter[str] = Counter()
    traces: list[dict[str, Any]] = []
    retried_ok = failed_turns = no_worker = 0
    for s in logs:
        served: list[tuple[int | None, float]] = []
        seen: set[int | None] = set()
        flapped: str | None = None
        causes: list[str] = []
        by_turn: dict[int, list[Attempt]] = {}
        for a in s.attempts:
            by_turn.setdefault(a.turn, []).append(a)
            if a.ok:
                w = worker_index(a.worker)
                no_worker += w is None
                if served and served[-1][0] != w:
                    left, before = served[-1]
                    cause = _move_cause(left, before, a.end, s, faults, routers, down, a.router, w)
                    moves[cause] += 1
                    causes.append(cause)
                    if w in seen and flapped is None:
                        flapped = cause
                served.append((w, a.end))
                seen.add(w)
            else:
                cause = _cause(a, faults)
                errors[cause] += 1
                details.setdefault(cause, Counter())[a.error or "?"] += 1
        for a in s.releases:
            if not a.ok:
                cause = _cause(a, faults)
                errors[cause] += 1
                details.setdefault(cause, Counter())[f"finish_session {a.error}"] += 1
        if flapped is not None:
            flaps[flapped] += 1
        worst = any(c in _PROBLEMS for c in causes)
        if causes and (len(traces) < 20 or (worst and len(traces) < 60)):
            traces.append(
                {
                    "session": s.sid,
                    "move_causes": causes,
                    "turns": [
                        (a.turn, a.router, round(a.start, 2), worker_index(a.worker), a.error)
                        for a in s.attempts
                    ],
                }
            )
        for attempts in by_turn.values():
            if attempts[-1].ok and len(attempts) > 1:
                retried_ok += 1
            elif not attempts[-1].ok:
                failed_turns += 1
    for f in faults:  # requests open when the fault hit (through the router, for a router)
        f["open_at_start"] = sum(
            a.start <= f["start_s"] <= a.end
            and (f["kind"] != "router_restart" or a.router == f["target"])
            for s in logs
            for a in s.attempts
        )
        if f["kind"] == "replica_slow":
            f["placed_per_worker"] = _placed(logs, f, worker_index)
    took = sorted(a.end - a.start for s in logs for a in s.attempts if a.ok)
    return {
        "ok_attempt_s_median": round(took[len(took) // 2], 3) if took else None,
        "sessions": len(logs),
        "completed": states["completed"],
        "aborted": states["aborted"],
        "lost": states["running"],
        "turns_planned": sum(s.turns for s in logs),
        "turns_ok": sum(s.done_turns for s in logs),
        "turns_ok_after_retry": retried_ok,
        "turns_failed": failed_turns,
        "turns_not_sent": sum(
            s.turns - s.done_turns - (s.state == "aborted") for s in logs if s.state != "running"
        ),
        "attempts": sum(len(s.attempts) for s in logs),
        "failed_attempts": dict(errors),
        "failed_attempt_details": {k: dict(v) for k, v in details.items()},
        "unexplained_errors": errors["unexplained"],
        "ok_without_worker_header": no_worker,
        "moves": dict(moves),
        "unexplained_moves": moves["unexplained"],
        "pins_not_restored": moves["redis restart: pin not restored"],
        "flapping_sessions": dict(flaps),
        "unexplained_flaps": flaps["unexplained"],
        "moved_session_traces": traces,
        "streaming_sessions": sum(s.stream for s in logs),
    }


def print_table(result: dict[str, Any]) -> None:
    """Print the faults, the accounting and the verdict."""
    from rich.console import Console
    from rich.table import Table

    r = result
    console = Console()
    faults = Table(title=f"chaos ({r['schedule']}): faults, seconds since the load started")
    for col in ("fault", "target", "start", "back", "open requests", "note"):
        faults.add_column(col, justify="left" if col in ("fault", "note") else "right")
    for f in r["faults"]:
        back = f"{f['end_s']:.1f}"
        start, opened = f"{f['start_s']:.1f}", str(f.get("open_at_start"))
        note = f["note"]
        if "placed_per_worker" in f:
            per = ", ".join(f"{w}: {n}" for w, n in f["placed_per_worker"].items())
            note += f"; sessions placed meanwhile per replica: {per or 'none'}"
        faults.add_row(_LABEL[f["kind"]], str(f["target"]), start, back, opened, note)
    console.print(faults)
    a = r["accounting"]
    t = Table(title=f"{a['sessions']} sessions, {a['attempts']} attempts over 2 routers")
    t.add_column("what")
    t.add_column("count", justify="right")
    rows: list[tuple[str, Any]] = [
        ("sessions completed", a["completed"]),
        ("sessions aborted (a turn failed every attempt)", a["aborted"]),
        ("sessions lost (no outcome after the drain)", a["lost"]),
        ("turns ok / planned", f"{a['turns_ok']} / {a['turns_planned']}"),
        ("turns ok after a retry", a["turns_ok_after_retry"]),
        ("median seconds of an answered attempt", a["ok_attempt_s_median"]),
        ("turns failed (retries exhausted)", a["turns_failed"]),
    ]
    for cause, n in sorted(a["failed_attempts"].items()):
        kinds = ", ".join(f"{k} x{v}" for k, v in a["failed_attempt_details"][cause].items())
        rows.append((f"failed attempts: {cause} ({kinds})", n))
    for cause, n in sorted(a["moves"].items()):
        rows.append((f"session moved to another worker: {cause}", n))
    for cause, n in sorted(a["flapping_sessions"].items()):
        rows.append((f"sessions back on a worker they had left (flap): {cause}", n))
    f = r["finish"]
    rows.append(("sessions released per router", " / ".join(map(str, f["ok_per_router"]))))
    rows.append(("sessions released after the run (cut by the drain)", f["after_run"]))
    rows.append(("sessions never released", f["failed"]))
    red = r["redis_after"]
    rows.append(("Redis pins after the run / live sessions", f"{red['pins']} / {red['live']}"))
    rows.append(
        (
            "  of which released while Redis was away (written back from a router's cache)",
            red.get("restored_after_release", 0),
        )
    )
    rows.append(("Redis keys after the run", red["keys"]))
    for row in rows:
        t.add_row(row[0], str(row[1]))
    console.print(t)
    rss = Table(title="router RSS (MiB)")
    rss.add_column("router")
    for point in r["rss_points"]:
        rss.add_column(point, justify="right")
    for name, samples in r["rss_mib"].items():
        rss.add_row(name, *(str(samples.get(p)) for p in r["rss_points"]))
    console.print(rss)
    console.print(
        ("OK" if r["ok"] else "FAILED") + f": {'; '.join(r['problems']) or 'every check held'}"
    )
