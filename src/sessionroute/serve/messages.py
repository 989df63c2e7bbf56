"""What the proxy writes: the request to a worker, and every answer to the client.

Shared by the two ways a proxied request runs, the callback-driven common case
(:mod:`sessionroute.serve.inline`) and the coroutines (:mod:`sessionroute.serve.proxy`), so a
request gets the same bytes, headers and records whichever path answered it:

- :func:`upstream_request`: the request as it goes to a worker (the client's headers as
  received, minus the hop-by-hop ones, plus ``Host``, the worker credential and
  ``Content-Length``);
- :func:`relay_headers`, :func:`relay_whole`: a worker's answer relayed to the client;
- :func:`error`, :func:`refuse`, :func:`refusal`, :func:`too_large`: the router's own JSON
  error answers (each with the request id), and :func:`timed_out`, the message of a timeout.

What an answer or a failure says about the worker, and whether the request is retried, is the
router core's to decide (:mod:`sessionroute.router.failures`); this module only writes.
"""

from __future__ import annotations

from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router.actions import Refuse
from sessionroute.serve.errors import error_for_exception, error_response
from sessionroute.serve.exchange import Exchange
from sessionroute.serve.http1 import Connection, Request
from sessionroute.serve.router import Router

__all__ = [
    "BUFFER_LIMIT",
    "error",
    "refusal",
    "refuse",
    "relay_headers",
    "relay_whole",
    "relayed_whole",
    "timed_out",
    "too_large",
    "upstream_request",
]

BUFFER_LIMIT = 256 * 1024
"""Responses with a Content-Length up to this many bytes are relayed in one write."""


# -- to the worker ---------------------------------------------------------------------------
def upstream_request(router: Router, req: Request, worker: str) -> list[bytes]:
    """``req`` as it goes to ``worker``: the head, then the body's pieces as received.

    The head is the request line and ``Host`` for ``worker``, the client's headers as
    received less the dropped ones (``req`` comes from the router's listener, whose
    ``forward_drop`` is :attr:`Router.request_drop`: :attr:`Request.forward` holds the lines
    to forward), the worker credential and the ``Content-Length``.
    """
    if req.connection_header:  # it names more headers to drop (rare with HTTP/1.1 clients)
        forward = _forwarded_without_connection_tokens(router, req)
    else:
        forward = b"".join(req.forward)
    head = router.upstream.request_head(worker, req.method, req.target)
    tail = b"Content-Length: %d\r\n\r\n" % req.size
    return [head + forward + router.worker_auth + tail, *req.parts]


def _forwarded_without_connection_tokens(router: Router, req: Request) -> bytes:
    """The client's header lines less the dropped ones and those its ``Connection`` header
    names (RFC 9110 7.6.1)."""
    drop = set(router.request_drop)
    for name, value in req.headers:
        if name.lower() == b"connection":
            drop.update(t.strip().lower() for t in value.split(b","))
    return b"".join(b"%s: %s\r\n" % kv for kv in req.headers if kv[0].lower() not in drop)


# -- a worker's answer -----------------------------------------------------------------------
def relayed_whole(ex: Exchange) -> bool:
    """The answer has a length up to :data:`BUFFER_LIMIT`: it is read whole and relayed in
    one write (anything else is relayed piece by piece as it arrives)."""
    return ex.length is not None and ex.length <= BUFFER_LIMIT


def relay_headers(router: Router, ex: Exchange, rid: bytes) -> bytes:
    """The header lines of a relayed answer: the worker's (less those the router writes
    itself), the request id and, with ``--expose-worker``, the worker."""
    headers = b"".join(ex.relay_lines) + b"x-request-id: " + rid + b"\r\n"
    if router.expose_worker:  # --expose-worker-header and/or --route-receipts
        headers += router.worker_header(ex.worker, rid, ex.status)
    return headers


def relay_whole(conn: Connection, router: Router, ex: Exchange, rid: bytes, body: bytes) -> None:
    """Answer with the worker's status, relayed headers and the whole ``body`` (whose
    ``usage.cached_tokens`` feed the per-worker prefix-cache metrics with
    ``--usage-metrics``)."""
    if router.usage is not None:
        router.usage.observe(ex.worker, body)
    conn.respond_raw(ex.status, relay_headers(router, ex, rid), body)


# -- the router's own answers ----------------------------------------------------------------
def error(
    conn: Connection, status: int, message: str, code: str, rid: bytes, *, keep: bool = True
) -> None:
    """Answer with a JSON error (and the request id)."""
    resp = error_response(status, message, code)
    conn.respond_raw(
        status,
        resp.header_bytes() + b"x-request-id: " + rid + b"\r\n",
        resp.body,
        keep_alive=keep,
    )


def refuse(conn: Connection, exc: NoWorkerAvailable | AdmissionRefused, rid: bytes) -> None:
    """Answer a request that could not be placed (503, or admission's 429/503)."""
    resp = error_for_exception(exc)
    conn.respond_raw(
        resp.status, resp.header_bytes() + b"x-request-id: " + rid + b"\r\n", resp.body
    )


def refusal(conn: Connection, action: Refuse, rid: bytes) -> None:
    """Answer with the router core's :class:`~sessionroute.router.actions.Refuse`."""
    error(conn, action.status, action.message, action.code, rid)


def timed_out(router: Router, worker: str, *, reading: bool = False) -> str:
    """The message of an attempt whose request timeout passed before ``worker``'s answer
    (``reading``: before its body) was complete."""
    what = "finish its response" if reading else "answer"
    return f"upstream {worker} did not {what} within {router.core.config.request_timeout_s} s"


def too_large(conn: Connection, req: Request, limit: int, rid: bytes) -> None:
    """Answer 413: the body is over ``limit`` bytes (by its Content-Length or as received)."""
    length = req.content_length
    got = f"{length} bytes" if length is not None and length > limit else f"over {limit} bytes"
    error(
        conn,
        413,
        f"request body of {got} exceeds --max-payload-size of {limit} bytes",
        "payload_too_large",
        rid,
        keep=req.complete,
    )
