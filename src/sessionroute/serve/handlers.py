"""Admin and probe endpoints: sessions, workers, liveness, readiness, health, models, metrics.

Shapes and statuses follow ``shared/ROUTER.md`` ("Endpoints").
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote

from sessionroute.errors import WorkerError
from sessionroute.serve.compat_routes import first_answer
from sessionroute.serve.errors import error_for_exception, error_response
from sessionroute.serve.http1 import Request
from sessionroute.serve.metrics import CONTENT_TYPE
from sessionroute.serve.router import Router
from sessionroute.serve.wire import Response, json_response

__all__ = [
    "add_worker",
    "finish_session",
    "health",
    "list_workers",
    "liveness",
    "metrics",
    "models",
    "readiness",
    "remove_worker",
    "session_info",
]


async def finish_session(request: Request, router: Router) -> Response:
    """``POST /finish_session?session_id=ID``: release a session (idempotent, 200).

    The id is URL-decoded and matched exactly; an empty id is accepted as a no-op. A missing
    ``session_id`` parameter is a 400 naming it.
    """
    sid = _query_param(request, "session_id")
    if sid is None:
        return error_response(400, "missing query parameter 'session_id'", "missing_session_id")
    if sid:
        router.core.finish_session(sid)
        if router.state is not None:
            await router.state.finish(sid)
    return json_response({"status": "ok", "session_id": sid})


async def list_workers(request: Request, router: Router) -> Response:
    """``GET /list_workers``: ``{"urls": [...]}`` in the order they were added."""
    return json_response({"urls": list(router.core.cluster.workers())})


def _query_param(request: Request, name: str) -> str | None:
    """The first value of query parameter ``name``, URL-decoded ("+" is a space), or None."""
    for key, value in parse_qsl(request.query, keep_blank_values=True):
        if key == name:
            return value
    return None


def _url_param(request: Request) -> str | None:
    """The ``url`` query parameter as given (matched exactly, as vllm-router), or None."""
    return _query_param(request, "url") or None


async def add_worker(request: Request, router: Router) -> Response:
    """``POST /add_worker?url=U``: add U once it passes its health check (400 otherwise)."""
    url = _url_param(request)
    if url is None:
        return error_response(400, "missing query parameter 'url'", "missing_url")
    try:
        await router.add_worker(url)
    except WorkerError as exc:
        return error_for_exception(exc)
    return json_response({"status": "ok", "url": url})


async def remove_worker(request: Request, router: Router) -> Response:
    """``POST /remove_worker?url=U``: remove U (400 when unknown); other sessions stay."""
    url = _url_param(request)
    if url is None:
        return error_response(400, "missing query parameter 'url'", "missing_url")
    try:
        router.remove_worker(url)
    except WorkerError as exc:
        return error_for_exception(exc)
    return json_response({"status": "ok", "url": url})


async def liveness(request: Request, router: Router) -> Response:
    """``GET /liveness``: 200 while the process serves."""
    return json_response({"status": "alive"})


async def readiness(request: Request, router: Router) -> Response:
    """``GET /readiness``: 200 with counts when a worker is available, else 503."""
    core = router.core
    cluster = core.cluster
    body = {"healthy_workers": len(cluster.healthy()), "total_workers": len(cluster.workers())}
    if core.ready():
        return json_response({"status": "ready", **body})
    return json_response({"status": "not_ready", **body}, 503)


async def health(request: Request, router: Router) -> Response:
    """``GET /health``: 200 when every worker is available, else 503; the worker URLs (of the
    unavailable ones) only for a client allowed the admin routes (``request.trusted``)."""
    unhealthy = router.core.unavailable_workers()
    if not request.trusted:
        return json_response(
            {"status": "unhealthy" if unhealthy else "healthy"}, 503 if unhealthy else 200
        )
    if unhealthy:
        return json_response({"status": "unhealthy", "unhealthy_workers": unhealthy}, 503)
    return json_response({"status": "healthy", "workers": len(router.core.cluster.workers())})


async def session_info(request: Request, router: Router) -> Response:
    """``GET /sessions/{id}``: the session's worker, age, turns and last turn (404 when the
    policy holds no pin for it). The id is URL-decoded; times are seconds on the router's
    clock: ``age_s`` since it was pinned to that worker, ``origin`` where the id was read
    (a header's lower-case name or ``body:<field>``; null when no longer known), ``idle_s``
    since its last turn, ``expires_in_s`` until its idle TTL runs out."""
    sid = unquote(request.path[len("/sessions/") :])
    core = router.core
    policy = core.policy
    info = policy.session_info(sid) if sid else None
    if info is None:
        why = (
            "no pin for this session (never seen, released, expired, or its worker removed)"
            if policy.keeps_sessions
            else f"policy {policy.name!r} keeps no session table"
        )
        return error_response(404, f"{why}: {sid!r}", "session_not_found")
    now = router.clock.now()
    return json_response(
        {
            "session_id": sid,
            "origin": core.requests.origins.get(sid),
            "worker": info.worker,
            "age_s": round(now - info.pinned_at, 3),
            "turns": info.turns,
            "idle_s": round(now - info.last_seen, 3),
            "expires_in_s": round(info.expires_in_s(now), 3),
            "worker_available": core.cluster.is_healthy(info.worker)
            if info.worker in core.cluster
            else False,
        }
    )


async def models(request: Request, router: Router) -> Response:
    """``GET /v1/models``: the first available worker's answer; 503 when none, 502 if all fail."""
    timeout_s = router.settings.health_check_timeout_secs
    return await first_answer(router, "/v1/models", "/v1/models", timeout_s)


async def metrics(request: Request, router: Router) -> Response:
    """``GET /metrics``: Prometheus text format."""
    body = router.metrics.render()
    return Response(200, body, CONTENT_TYPE)
