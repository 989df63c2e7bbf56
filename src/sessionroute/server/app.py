"""The HTTP front of a router: routes, authentication and JSON errors.

Routes (``shared/ROUTER.md``): ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/embeddings`` (proxied); ``POST /finish_session``, ``/add_worker``,
``/remove_worker``; ``GET /list_workers``, ``/liveness``, ``/readiness``, ``/health``,
``/v1/models``, ``/metrics``. With ``--router-api-key`` every route but ``/liveness``,
``/readiness`` and ``/health`` (and any unknown path) needs ``Authorization: Bearer <key>``
(compared in constant time); any other request gets a 401 JSON error. Unknown routes and
methods get 404/405 JSON errors; an unexpected exception is a 500 JSON error and never takes
the router down.

The listener is aiohttp's low-level :class:`aiohttp.web.Server` with one handler,
:class:`RouterHandler`, that dispatches on a dictionary of paths and does authentication and
error mapping inline: aiohttp's ``Application`` (URL dispatcher, match info, middleware
chain) cost a few dozen microseconds per proxied request for no feature the router uses.
GET routes also answer HEAD, as aiohttp's ``add_get`` does.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11

from sessionroute.server import handlers
from sessionroute.server.errors import error_for_exception, error_response
from sessionroute.server.proxy import proxy_request
from sessionroute.server.router import Router

__all__ = ["GENERATION_ROUTES", "RouterHandler", "build_metrics_server", "build_server"]

log = logging.getLogger("sessionroute.server")

GENERATION_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
)
"""Routes proxied to a worker chosen by the policy."""

_OPEN_ROUTES = frozenset({"/liveness", "/readiness", "/health"})

Handler = Callable[[web.BaseRequest, Router], Awaitable[web.StreamResponse]]
"""A route handler: the request and the router."""


class RouterHandler:
    """The request handler of a router listener (see the module docstring).

    Args:
        router: the router the handlers act on.
        routes: path -> method -> handler; GET routes also answer HEAD.
    """

    def __init__(self, router: Router, routes: Mapping[str, Mapping[str, Handler]]) -> None:
        self._router = router
        table: dict[str, dict[str, Handler]] = {}
        for path, methods in routes.items():
            table[path] = dict(methods)
            if "GET" in methods and "HEAD" not in methods:
                table[path]["HEAD"] = methods["GET"]
        self._routes = table
        key = router.settings.router_api_key
        self._expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        """Dispatch one request; never raises for anything the client sent."""
        path = request.path
        if self._expected is not None and path not in _OPEN_ROUTES:
            got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(got, self._expected):
                return error_response(
                    401,
                    "missing or invalid router API key (send 'Authorization: Bearer <key>')",
                    "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        methods = self._routes.get(path)
        if methods is None:
            return error_response(404, "Not Found", "not_found")
        handler = methods.get(request.method)
        if handler is None:
            return error_response(
                405,
                "Method Not Allowed",
                "method_not_allowed",
                headers={"Allow": ", ".join(sorted(methods))},
            )
        try:
            if "Expect" in request.headers:
                refused = await _expect(request)
                if refused is not None:
                    return refused
            return await handler(request, self._router)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_for_exception(exc)
        except (ConnectionResetError, TimeoutError):
            raise
        except Exception as exc:
            log.exception("unhandled error on %s %s", request.method, path)
            return error_for_exception(exc)


async def _expect(request: web.BaseRequest) -> web.Response | None:
    """Answer ``Expect: 100-continue`` (as aiohttp's default expect handler); 417 otherwise."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the final response has not started
        return None
    return error_response(417, f"unknown Expect: {expect}", "expectation_failed")


def _routes(router: Router) -> dict[str, dict[str, Handler]]:
    routes: dict[str, dict[str, Handler]] = {
        path: {"POST": proxy_request} for path in GENERATION_ROUTES
    }
    routes.update(
        {
            "/finish_session": {"POST": handlers.finish_session},
            "/add_worker": {"POST": handlers.add_worker},
            "/remove_worker": {"POST": handlers.remove_worker},
            "/list_workers": {"GET": handlers.list_workers},
            "/liveness": {"GET": handlers.liveness},
            "/readiness": {"GET": handlers.readiness},
            "/health": {"GET": handlers.health},
            "/v1/models": {"GET": handlers.models},
            "/metrics": {"GET": handlers.metrics},
        }
    )
    return routes


def build_server(router: Router, **kwargs: Any) -> web.Server:
    """The router's main listener handler (start the router itself with ``router.start()``).

    Args:
        router: the router.
        **kwargs: passed to :class:`aiohttp.web.Server` (``access_log``,
            ``handler_cancellation``, ...).
    """
    return web.Server(RouterHandler(router, _routes(router)), **kwargs)


def build_metrics_server(router: Router, **kwargs: Any) -> web.Server:
    """A listener serving only ``GET /metrics`` (for ``--prometheus-port``)."""
    handler = RouterHandler(router, {"/metrics": {"GET": handlers.metrics}})
    return web.Server(handler, **kwargs)
