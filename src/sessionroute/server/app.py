"""The aiohttp application of a router: routes, authentication and JSON errors.

Routes (``shared/ROUTER.md``): ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/embeddings`` (proxied); ``POST /finish_session``, ``/add_worker``,
``/remove_worker``; ``GET /list_workers``, ``/liveness``, ``/readiness``, ``/health``,
``/v1/models``, ``/metrics``. With ``--router-api-key`` every route but ``/liveness``,
``/readiness`` and ``/health`` needs ``Authorization: Bearer <key>`` (compared in constant
time); any other request gets a 401 JSON error. Unknown routes and methods get 404/405 JSON
errors; an unexpected exception is a 500 JSON error and never takes the router down.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from sessionroute.server import handlers
from sessionroute.server.errors import error_for_exception, error_response
from sessionroute.server.handlers import ROUTER_KEY
from sessionroute.server.proxy import proxy_request
from sessionroute.server.router import Router

__all__ = ["GENERATION_ROUTES", "ROUTER_KEY", "build_app", "build_metrics_app"]

log = logging.getLogger("sessionroute.server")

GENERATION_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
)
"""Routes proxied to a worker chosen by the policy."""

_OPEN_ROUTES = frozenset({"/liveness", "/readiness", "/health"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _auth_middleware(key: str) -> Middleware:
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _OPEN_ROUTES:
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return error_response(
                    401,
                    "missing or invalid router API key (send 'Authorization: Bearer <key>')",
                    "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return auth


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_for_exception(exc)
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception as exc:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_for_exception(exc)


def build_app(router: Router) -> web.Application:
    """The router's application; starting it starts the router, cleaning it up closes it."""
    middlewares: list[Middleware] = [_json_errors]
    if router.settings.router_api_key:
        middlewares.append(_auth_middleware(router.settings.router_api_key))
    app = web.Application(middlewares=middlewares, client_max_size=router.settings.max_payload_size)
    app[ROUTER_KEY] = router

    async def proxy(request: web.Request) -> web.StreamResponse:
        return await proxy_request(request, router)

    for path in GENERATION_ROUTES:
        app.router.add_post(path, proxy)
    app.router.add_post("/finish_session", handlers.finish_session)
    app.router.add_post("/add_worker", handlers.add_worker)
    app.router.add_post("/remove_worker", handlers.remove_worker)
    app.router.add_get("/list_workers", handlers.list_workers)
    app.router.add_get("/liveness", handlers.liveness)
    app.router.add_get("/readiness", handlers.readiness)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/metrics", handlers.metrics)

    async def on_startup(_: web.Application) -> None:
        await router.start()

    async def on_cleanup(_: web.Application) -> None:
        await router.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def build_metrics_app(router: Router) -> web.Application:
    """A separate application serving only ``GET /metrics`` (for ``--prometheus-port``)."""
    middlewares: list[Middleware] = [_json_errors]
    if router.settings.router_api_key:
        middlewares.append(_auth_middleware(router.settings.router_api_key))
    app = web.Application(middlewares=middlewares)
    app[ROUTER_KEY] = router
    app.router.add_get("/metrics", handlers.metrics)
    return app
