"""vllm-router 0.1.17's other routes: served as it serves them, or refused by name.

Served (shapes measured against the ``vllm-router`` binary in front of fake workers):

* ``POST /workers``, ``GET /workers/{url}``, ``DELETE /workers/{url}``: add, show and
  remove a worker (:mod:`sessionroute.serve.workers_admin`);
* ``GET /workers``: ``{"workers": [{"url", "model_id", "worker_type", "is_healthy", "load",
  "connection_mode", "priority", "cost"}], "total": N, "stats": {...}}``; ``load`` is the
  router's in-flight requests on the worker;
* ``GET /get_server_info``, ``GET /get_model_info``, ``GET /health_generate``: the first
  available worker's answer to the same path, passed through (503 when none is available);
* ``GET /get_loads``: ``{"workers": [{"worker": URL, "load": N}]}`` with the router's
  in-flight requests per worker (vllm-router asks each worker's ``/get_load``, which vLLM's
  API server does not have, and reports -1 then);
* ``POST /flush_cache``: ``POST /flush_cache`` to every worker; 200 ``Cache flushed on all
  servers`` when all answer 2xx, else 500 ``Cache flush failed on one or more servers``;
* ``POST /generate``, ``/rerank``, ``/v1/rerank``: proxied like the OpenAI routes
  (:data:`EXTRA_GENERATION_ROUTES`).

Refused with a 501 that names the route and the feature (:data:`REFUSED_ROUTES`): the stored
Responses API (``/v1/responses/{id}``...), program scheduling's diagnostics, the gRPC
frontend's ``/render`` routes, the inference gateway's ``/inference/v1/generate``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from sessionroute.serve import workers_admin
from sessionroute.serve.errors import error_response
from sessionroute.serve.http1 import Request
from sessionroute.serve.router import Router
from sessionroute.serve.wire import Response, json_response

__all__ = ["EXTRA_GENERATION_ROUTES", "REFUSED_ROUTES", "first_answer", "routes"]

Handler = Callable[[Request, Router], Awaitable[Response]]

EXTRA_GENERATION_ROUTES: tuple[str, ...] = ("/generate", "/rerank", "/v1/rerank")
"""vllm-router's other generation routes, routed by the policy and proxied."""

REFUSED_ROUTES: dict[str, str] = {
    "/v1/responses/": "the stored Responses API (retrieve, cancel, input items)",
    "/scheduling/diagnostics": "program scheduling",
    "/v1/chat/completions/render": "request rendering (vllm-router's gRPC frontend)",
    "/v1/completions/render": "request rendering (vllm-router's gRPC frontend)",
    "/v1/responses/render": "request rendering (vllm-router's gRPC frontend)",
    "/inference/v1/generate": "the inference gateway's transparent proxy",
}
"""vllm-router routes answered 501 with the feature's name (a path ending in "/" is a
prefix)."""


async def workers(request: Request, router: Router) -> Response:
    """``GET /workers``: every worker in vllm-router's shape."""
    cluster = router.core.cluster
    urls = list(cluster.workers())
    return json_response(
        {
            "workers": [
                {
                    "url": url,
                    "model_id": "unknown",
                    "worker_type": "regular",
                    "is_healthy": cluster.is_healthy(url),
                    "load": cluster.in_flight(url),
                    "connection_mode": "Http",
                    "priority": 50,
                    "cost": 1.0,
                }
                for url in urls
            ],
            "total": len(urls),
            "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(urls)},
        }
    )


async def get_loads(request: Request, router: Router) -> Response:
    """``GET /get_loads``: the router's in-flight requests per worker."""
    cluster = router.core.cluster
    return json_response(
        {"workers": [{"worker": u, "load": cluster.in_flight(u)} for u in cluster.workers()]}
    )


async def forward_get(request: Request, router: Router) -> Response:
    """The first available worker's answer to ``GET <path>`` (the query kept), passed
    through; 503 when no worker is available, 502 when none answers."""
    target = request.path + (f"?{request.query}" if request.query else "")
    return await first_answer(router, target, request.path, router.settings.request_timeout_secs)


async def first_answer(router: Router, target: str, what: str, timeout_s: float) -> Response:
    """``GET target`` from each available worker in turn; the first answer, passed through.

    Args:
        router: the router (its available workers, client session and worker credential).
        target: the path and query to get.
        what: the route named in the 502's message.
        timeout_s: seconds each worker has to answer.

    Returns:
        The worker's answer; 503 when no worker is available, 502 when none answers.
    """
    healthy = router.core.cluster.healthy()
    if not healthy:
        return error_response(503, "no healthy worker available", "no_worker_available")
    errors: list[str] = []
    for url in healthy:
        try:
            async with router.session.get(
                url.rstrip("/") + target,
                headers=router.worker_headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                body = await resp.read()
                ctype = resp.headers.get("Content-Type", "application/json")
                return Response(resp.status, body, ctype)
        except (TimeoutError, aiohttp.ClientError) as exc:
            errors.append(f"{url}: {type(exc).__name__}")
    return error_response(
        502, f"no worker answered {what}: " + "; ".join(errors), "upstream_unreachable"
    )


async def flush_cache(request: Request, router: Router) -> Response:
    """``POST /flush_cache`` on every worker (vllm-router's answers and statuses)."""

    async def one(url: str) -> bool:
        try:
            async with router.session.post(
                url.rstrip("/") + "/flush_cache",
                headers=router.worker_headers,
                timeout=aiohttp.ClientTimeout(total=router.settings.request_timeout_secs),
            ) as resp:
                await resp.read()
                return 200 <= resp.status < 300
        except (TimeoutError, aiohttp.ClientError):
            return False

    results = await asyncio.gather(*(one(u) for u in router.core.cluster.workers()))
    if all(results):
        return Response(200, b"Cache flushed on all servers", "text/plain; charset=utf-8")
    return Response(500, b"Cache flush failed on one or more servers", "text/plain; charset=utf-8")


def _refuse(feature: str) -> Handler:
    async def refuse(request: Request, router: Router) -> Response:
        return error_response(
            501,
            f"{request.method} {request.path}: a vllm-router route for {feature}, which "
            "sessionroute serve does not implement",
            "not_implemented",
        )

    return refuse


def routes() -> dict[str, dict[str, Handler]]:
    """The routes of this module by path and method (a path ending in "/" is a prefix)."""
    table: dict[str, dict[str, Handler]] = {
        "/workers": {"GET": workers, "POST": workers_admin.create_worker},
        workers_admin.PREFIX: {
            "GET": workers_admin.get_worker,
            "DELETE": workers_admin.delete_worker,
        },
        "/get_loads": {"GET": get_loads},
        "/get_server_info": {"GET": forward_get},
        "/get_model_info": {"GET": forward_get},
        "/health_generate": {"GET": forward_get},
        "/flush_cache": {"POST": flush_cache},
    }
    for path, feature in REFUSED_ROUTES.items():
        refuse = _refuse(feature)
        table[path] = {m: refuse for m in ("GET", "POST", "DELETE")}
    return table
