"""The HTTP front of a router: routes, authentication and JSON errors.

Routes (``shared/ROUTER.md``): ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/responses``, ``/v1/embeddings`` (proxied); ``POST /finish_session``, ``/add_worker``,
``/remove_worker``; ``GET /list_workers``, ``/liveness``, ``/readiness``, ``/health``,
``/v1/models``, ``/metrics``, ``/sessions/{id}``. With ``--router-api-key`` every route but
``/liveness``, ``/readiness`` and ``/health`` (and any unknown path) needs
``Authorization: Bearer <key>`` (the scheme in any case, RFC 9110 11.1; the key compared in
constant time); any other request gets a 401 JSON error. The admin routes (``/add_worker``,
``/remove_worker``, ``/sessions/{id}``) need that key when one is set; without one they answer
loopback clients only (403 otherwise) unless ``--allow-remote-admin`` opens them: anyone who
reaches the port could otherwise make the router send traffic to any URL. ``/health`` tells
only ok / not ok (200 / 503) to a client that could not use the admin routes; the worker URLs
are for the others. Unknown routes and methods get 404/405 JSON errors; an unexpected
exception is a 500 JSON error and never takes the router down.

The listener is the router's own HTTP/1.1 protocol (:mod:`sessionroute.serve.http1`);
:meth:`RouterApp.handle` is its handler: authentication, a dictionary of paths and methods, and
``Expect`` handling inline, then either the proxy (which writes the upstream answer straight to
the connection) or a generic handler returning a :class:`~sessionroute.serve.wire.Response`.
GET routes also answer HEAD.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from sessionroute.serve import backpressure, compat_routes, handlers
from sessionroute.serve.errors import error_for_exception, error_response
from sessionroute.serve.http1 import Connection, Inline, Request
from sessionroute.serve.inline import InlineProxy
from sessionroute.serve.listener import Listener
from sessionroute.serve.router import Router
from sessionroute.serve.wire import Response

__all__ = ["GENERATION_ROUTES", "RouterApp", "build_listener", "build_metrics_listener"]

log = logging.getLogger("sessionroute.serve")

GENERATION_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
)
"""Routes proxied to a worker chosen by the policy."""

_OPEN_ROUTES = frozenset({"/liveness", "/readiness", "/health"})
_ADMIN_ROUTES = frozenset({"/add_worker", "/remove_worker", "/flush_cache"})
_SESSIONS = "/sessions/"
_WORKER_WRITES = frozenset({"POST", "DELETE"})
"""Methods that make ``/workers`` and ``/workers/{url}`` admin routes (add, remove)."""

Handler = Callable[[Request, Router], Awaitable[Response]]
"""A generic route handler: the request (body not awaited) and the router."""

_PROXY = "proxy"


class RouterApp:
    """The request handler of a router listener (see the module docstring).

    Args:
        router: the router the handlers act on.
        routes: path -> method -> handler (or ``"proxy"`` for a generation route); GET
            routes also answer HEAD.
    """

    def __init__(self, router: Router, routes: Mapping[str, Mapping[str, Handler | str]]) -> None:
        self._router = router
        table: dict[str, dict[str, Handler | str]] = {}
        for path, methods in routes.items():
            table[path] = dict(methods)
            if "GET" in methods and "HEAD" not in methods:
                table[path]["HEAD"] = methods["GET"]
        self._routes = table
        self._prefixes = tuple(p for p in table if p.endswith("/"))
        """Paths that match every path they begin (``/sessions/``), tried on a miss."""
        key = router.settings.router_api_key
        self._key = key.encode() if key else None
        self._expected = b"Bearer " + self._key if self._key else None
        self._remote_admin = router.settings.allow_remote_admin

    def _key_ok(self, req: Request) -> bool:
        """The request carries the router key (``Bearer`` in any case)."""
        got = req.lower.get(b"authorization")
        if got is None or self._key is None:
            return False
        if got == self._expected:
            return True
        scheme, _, token = got.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    def _admin_ok(self, conn: Connection, req: Request) -> bool:
        """May this request use the admin routes (module docstring)?"""
        if self._key is not None:
            return self._key_ok(req)
        return self._remote_admin or conn.peer_is_loopback()

    def handle(self, conn: Connection, req: Request) -> Coroutine[Any, Any, None] | Inline | None:
        """Dispatch one request (headers complete); never raises for anything sent.

        The listener's handler (a bound method: calling it costs less than an instance's
        ``__call__``)."""
        path = req.path
        if self._key is not None and path not in _OPEN_ROUTES and not self._key_ok(req):
            conn.respond(
                error_response(
                    401,
                    "missing or invalid router API key (send 'Authorization: Bearer <key>')",
                    "invalid_api_key",
                    headers=(("WWW-Authenticate", "Bearer"),),
                )
            )
            return None
        methods = self._routes.get(path)
        if methods is None:
            for prefix in self._prefixes:
                if path.startswith(prefix):
                    methods = self._routes[prefix]
                    break
        if methods is None:
            conn.respond(error_response(404, "Not Found", "not_found"))
            return None
        if (
            path in _ADMIN_ROUTES
            or path.startswith(_SESSIONS)
            or (path.startswith("/workers") and req.method in _WORKER_WRITES)
        ):
            if not self._admin_ok(conn, req):
                conn.respond(
                    error_response(
                        403,
                        "admin routes answer loopback clients only when the router has no "
                        "--router-api-key (start it with a key, or --allow-remote-admin)",
                        "admin_forbidden",
                    )
                )
                return None
        elif path == "/health":
            req.trusted = self._admin_ok(conn, req)
        handler = methods.get(req.method)
        if handler is None:
            conn.respond(
                error_response(
                    405,
                    "Method Not Allowed",
                    "method_not_allowed",
                    headers=(("Allow", ", ".join(sorted(methods))),),
                )
            )
            return None
        if b"expect" in req.lower and not _expect(conn, req):
            return None
        if handler == _PROXY:
            return InlineProxy(conn, req, self._router)
        if isinstance(handler, str):
            raise TypeError(f"unknown route kind {handler!r}")
        return _generic(conn, req, handler, self._router)


def _expect(conn: Connection, req: Request) -> bool:
    """Answer ``Expect: 100-continue`` (417 for other expectations); False when answered."""
    if req.http10:
        return True
    expect = req.lower[b"expect"]
    if expect.lower() == b"100-continue":
        if not req.complete and not req.too_large:
            conn.send_continue()
        return True
    text = expect.decode("utf-8", "replace")
    conn.respond(error_response(417, f"unknown Expect: {text}", "expectation_failed"))
    return False


async def _generic(conn: Connection, req: Request, handler: Handler, router: Router) -> None:
    try:
        resp = await handler(req, router)
    except Exception as exc:
        log.exception("unhandled error on %s %s", req.method, req.path)
        resp = error_for_exception(exc)
    conn.respond(resp)


def _routes() -> dict[str, dict[str, Handler | str]]:
    routes: dict[str, dict[str, Handler | str]] = {
        path: {"POST": _PROXY} for path in GENERATION_ROUTES
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
            _SESSIONS: {"GET": handlers.session_info},
        }
    )
    routes.update({path: {"POST": _PROXY} for path in compat_routes.EXTRA_GENERATION_ROUTES})
    routes["/backpressure"] = {"GET": backpressure.backpressure}
    for path, methods in compat_routes.routes().items():  # vllm-router's other routes
        routes[path] = dict(methods)
    return routes


def build_listener(router: Router) -> Listener:
    """The router's main listener (start it with ``await listener.start(host, port)``; start
    the router itself with ``router.start()``)."""
    s = router.settings
    access_log = logging.getLogger("sessionroute.access") if s.log_level == "debug" else None
    return Listener(
        RouterApp(router, _routes()).handle,
        max_body=s.max_payload_size,
        access_log=access_log,
        keepalive_s=s.idle_timeout_secs,
        header_timeout_s=s.header_timeout_secs,
        max_connections=s.max_connections,
        on_closed=router.metrics.count_client_closed,
        forward_drop=router.request_drop,
    )


def build_metrics_listener(router: Router) -> Listener:
    """A listener serving only ``GET /metrics`` (for ``--prometheus-port``)."""
    app = RouterApp(router, {"/metrics": {"GET": handlers.metrics}})
    return Listener(app.handle, max_body=router.settings.max_payload_size)
