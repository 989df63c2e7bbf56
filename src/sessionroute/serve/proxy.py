"""Proxying one generation request: route, forward, retry, relay, release.

The body is read once (as the pieces it arrived in) and forwarded as received; it is parsed
only when the policy reads the prompt (``Policy.needs_content``). Requests go upstream through
:class:`~sessionroute.serve.upstream.UpstreamPool` (a protocol of ours on the ``httptools``
response parser), with the client's headers forwarded as the raw bytes it sent. Responses
with a known length up to :data:`BUFFER_LIMIT` bytes are relayed in one write; everything
else (server-sent event streams in particular) is relayed chunk by chunk as it arrives, written
straight to the client connection (:class:`~sessionroute.serve.http1.Connection`) with
pre-serialized header bytes and its flow control.
Retries (on :data:`RETRY_STATUSES` and connection errors, with exponential backoff and
jitter) happen only before the first byte of a response is sent to the client. A worker that
refuses connections is marked unavailable at once, so the next attempt re-places the session.
The policy's reservation is released exactly once on every path (``try/finally``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.core import Reservation
from sessionroute.serve.errors import error_response
from sessionroute.serve.http1 import Connection, Request
from sessionroute.serve.router import Router
from sessionroute.serve.upstream import HOP_BY_HOP, Exchange, UpstreamConnectError, UpstreamError
from sessionroute.types import RouteRequest

__all__ = ["BUFFER_LIMIT", "HOP_BY_HOP", "RETRY_STATUSES", "prompt_text", "proxy_request"]

log = logging.getLogger("sessionroute.serve")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Upstream statuses that are retried (vllm-router's list)."""


_RESPONSE_DROP = frozenset(
    n.encode() for n in (*HOP_BY_HOP, "content-length", "x-request-id", "date", "server")
)

BUFFER_LIMIT = 256 * 1024
"""Responses with a Content-Length up to this many bytes are relayed in one write."""


def prompt_text(payload: Any) -> str:
    """The prompt text of an OpenAI request body: message contents joined, or the prompt.

    Chat ``messages[*].content`` strings (or the ``text`` of content parts) are concatenated in
    order; otherwise ``prompt`` (a string or list of strings) or ``input`` is used. Returns ""
    when none is present.
    """
    if not isinstance(payload, dict):
        return ""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
        return "".join(parts)
    for key in ("prompt", "input"):
        value = payload.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return "".join(value)
    return ""


def _header_block(router: Router, req: Request) -> bytes:
    """The client's headers as received, minus the dropped ones, plus the worker credential."""
    known = router.header_fates
    out: list[bytes] = []
    for name, value in req.headers:
        f = known.get(name)
        if f is None:
            f = router.header_fate(name)
        if f == 0:
            out += (name, b": ", value, b"\r\n")
        elif f == 2:  # Connection names more headers to drop (rare with HTTP/1.1 clients)
            return _header_block_connection(router, req)
    out.append(router.worker_auth)
    return b"".join(out)


def _header_block_connection(router: Router, req: Request) -> bytes:
    drop = set(router.request_drop)
    for name, value in req.headers:
        if name.lower() == b"connection":
            drop.update(t.strip().lower() for t in value.split(b","))
    kept = [b"%s: %s\r\n" % kv for kv in req.headers if kv[0].lower() not in drop]
    return b"".join(kept) + router.worker_auth


def _error(conn: Connection, status: int, message: str, code: str, rid: bytes) -> None:
    resp = error_response(status, message, code)
    conn.respond_raw(
        status, None, resp.header_bytes() + b"x-request-id: " + rid + b"\r\n", resp.body
    )


async def proxy_request(conn: Connection, req: Request, router: Router) -> None:
    """Handle one POST to a generation route (see the module docstring).

    Answers with JSON errors: 413 over ``--max-payload-size``, 400 for malformed JSON when the
    policy parses the body, 503 when no worker is available, 502 when every attempt failed
    to connect, 504 on upstream timeout; upstream error responses pass through.
    """
    s = router.settings
    lower = req.lower
    for name in router.request_id_names:
        raw_rid = lower.get(name)
        if raw_rid:
            rid = raw_rid.decode("utf-8", "replace")  # policies hash it: no lone surrogates
            break
    else:
        rid = router.new_request_id(req.path)
        raw_rid = rid.encode()
    parts = req.parts if req.complete else await req.body()
    if parts is None or req.too_large:
        _too_large(conn, req, s.max_payload_size, raw_rid)
        return
    size = req.size
    session_id: str | None = None
    session_header = "x-session-id"
    for name, label in router.session_names:
        value = lower.get(name)
        if value:
            value = value.rstrip(b" \t")
            if value:
                # "replace", as /finish_session decodes its query: the id must hash (UTF-8)
                session_id = value.decode("utf-8", "replace")
                session_header = label
                break
    text: str | None = None
    model: str | None = None
    if router.needs_content:
        try:
            payload = json.loads(b"".join(parts))
        except (ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
            _error(conn, 400, f"request body is not valid JSON: {exc}", "malformed_json", raw_rid)
            return
        text = prompt_text(payload)
        m = payload.get("model") if isinstance(payload, dict) else None
        model = m if isinstance(m, str) else None
    # Positional: a frozen dataclass's keyword __init__ costs twice as much. Field order:
    # session_id, prompt_tokens, text, tokens, model, request_id, session_header.
    route_req = RouteRequest(session_id, size // 4, text, None, model, rid, session_header)
    core = router.core
    t0 = time.perf_counter()
    try:
        reservation = core.route(route_req)
    except NoWorkerAvailable as exc:
        _error(conn, 503, str(exc), "no_worker_available", raw_rid)
        return
    router.metrics.observe_routing(t0, time.perf_counter())
    holder = [reservation]
    try:
        await _forward(conn, req, router, holder, parts, size, raw_rid)
    finally:
        core.complete(holder[0])


def _too_large(conn: Connection, req: Request, limit: int, rid: bytes) -> None:
    length = req.content_length
    got = f"{length} bytes" if length is not None and length > limit else f"over {limit} bytes"
    resp = error_response(
        413,
        f"request body of {got} exceeds --max-payload-size of {limit} bytes",
        "payload_too_large",
    )
    conn.respond_raw(
        413,
        None,
        resp.header_bytes() + b"x-request-id: " + rid + b"\r\n",
        resp.body,
        keep_alive=req.complete,
    )


async def _forward(
    conn: Connection,
    req: Request,
    router: Router,
    holder: list[Reservation],
    parts: list[bytes],
    size: int,
    rid: bytes,
) -> None:
    s = router.settings
    core = router.core
    metrics = router.metrics
    pool = router.upstream
    tail = _header_block(router, req) + b"Content-Length: %d\r\n\r\n" % size
    method = req.method
    path_qs = req.target.decode("utf-8", "surrogateescape")
    attempts = router.max_attempts
    last_error = ""
    task = conn.task  # not asyncio.current_task(): it costs a getpid() syscall
    if task is None:
        raise RuntimeError("proxy_request must run in a task")
    for attempt in range(attempts):
        res = holder[0]
        if attempt:
            metrics.count_retry(res.worker)
            if core.cluster.is_healthy(res.worker):
                await asyncio.sleep(router.backoff_s(attempt))
            if not core.cluster.is_healthy(res.worker):
                core.complete(res)
                try:
                    res = holder[0] = core.route(res.request)
                except NoWorkerAvailable:
                    _error(
                        conn,
                        503,
                        f"no worker available (last error: {last_error})",
                        "no_worker_available",
                        rid,
                    )
                    return
        worker = res.worker
        ex = Exchange(pool, worker, task)
        try:
            t0 = time.perf_counter()
            try:
                head = pool.heads.get((worker, method, path_qs)) or pool.request_head(
                    worker, method, path_qs
                )
                status = await ex.send((head + tail, *parts))
            except UpstreamConnectError as exc:
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                router.record_unreachable(worker, last_error)
                continue
            except UpstreamError as exc:  # reset, disconnect, malformed response
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                router.record_failure(worker)
                continue
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    metrics.count_request(worker, 499)  # the client went away (or shutdown)
                    raise
                router.record_failure(worker)
                metrics.count_request(worker, 504)
                _error(
                    conn,
                    504,
                    f"upstream {worker} did not answer within {s.request_timeout_secs} s",
                    "upstream_timeout",
                    rid,
                )
                return
            metrics.observe_upstream(worker, t0, time.perf_counter())
            if status >= 500:
                router.record_failure(worker)
            else:
                router.record_success(worker)
            if status in RETRY_STATUSES and attempt + 1 < attempts:
                if not await _drain(ex):
                    _timeout_reading(conn, router, worker, rid)
                    return
                last_error = f"{worker}: status {status}"
                continue
            await _relay(conn, router, ex, worker, rid)
            return
        finally:
            ex.close()
    metrics.count_request(holder[0].worker, 502)
    _error(
        conn,
        502,
        f"upstream unreachable after {attempts} attempt(s): {last_error}",
        "upstream_unreachable",
        rid,
    )
    return


_DRAIN_MAX_BYTES = 65536
"""Largest retried error body (bytes) read to keep its connection; a larger one, or one whose
length is not given, closes the connection instead."""


def _known_small(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the response declares a ``Content-Length`` of at most ``_DRAIN_MAX_BYTES``."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value) <= _DRAIN_MAX_BYTES
            except ValueError:
                return False
    return False


async def _drain(ex: Exchange) -> bool:
    """Read a retried error body so the connection can be reused; False on timeout.

    Only a body known to be small is read (see ``_DRAIN_MAX_BYTES``): a large, chunked or
    close-delimited one is left unread and :meth:`Exchange.close` closes its connection, so a
    worker streaming an endless error body cannot hold the retry back.
    """
    if not ex.complete and not _known_small(ex.headers):
        return True
    try:
        await ex.read()
    except UpstreamError:
        pass
    except asyncio.CancelledError:
        if not ex.is_timeout():
            raise
        return False
    return True


def _timeout_reading(conn: Connection, router: Router, worker: str, rid: bytes) -> None:
    """The deadline passed while reading a buffered body: a 504, as for a missing head."""
    router.record_failure(worker)
    router.metrics.count_request(worker, 504)
    _error(
        conn,
        504,
        f"upstream {worker} did not finish its response within "
        f"{router.settings.request_timeout_secs} s",
        "upstream_timeout",
        rid,
    )


def _response_headers(raw: list[tuple[bytes, bytes]]) -> tuple[bytes, int | None]:
    """The upstream's headers to relay (serialized) and its Content-Length (None if absent)."""
    out: list[bytes] = []
    length: int | None = None
    for name, value in raw:
        low = name.lower()
        if low in _RESPONSE_DROP:
            if low == b"content-length":
                length = int(value)
            continue
        out += (name, b": ", value, b"\r\n")
    return b"".join(out), length


async def _relay(conn: Connection, router: Router, ex: Exchange, worker: str, rid: bytes) -> None:
    status = ex.status
    metrics = router.metrics
    try:
        headers, length = _response_headers(ex.headers)
        headers += b"x-request-id: " + rid + b"\r\n"
        reason = ex.reason.decode("latin-1")
        if length is not None and length <= BUFFER_LIMIT:
            try:
                data = ex.body() if ex.complete else await ex.read()
            except UpstreamError as exc:
                router.record_failure(worker)
                metrics.count_request(worker, 502)
                _error(
                    conn,
                    502,
                    f"upstream {worker} failed while sending its response: {exc}",
                    "upstream_error",
                    rid,
                )
                return
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    raise
                _timeout_reading(conn, router, worker, rid)
                return
            metrics.count_request(worker, status)
            conn.respond_raw(status, reason, headers, data)
            return
        conn.start_response(status, reason, headers, length)
        try:
            await ex.relay(conn)  # written piece by piece as it arrives
        except (UpstreamError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not ex.is_timeout():
                raise
            log.warning("upstream %s failed mid-response: %r", worker, exc)
            router.record_failure(worker)
            metrics.count_request(worker, 502)
            conn.abort()  # no terminating chunk: the client sees truncation
            return
        conn.end_response()
        metrics.count_request(worker, status)
    except asyncio.CancelledError:
        metrics.count_request(worker, 499)
        raise
