"""Proxying one generation request: route, forward, retry, relay, release.

The body is read once and forwarded as received; it is parsed only when the policy reads the
prompt (``Policy.needs_content``). Requests go upstream through
:class:`~sessionroute.server.upstream.UpstreamPool` (aiohttp's client protocol without
``ClientSession``), with the client's headers forwarded as the raw bytes it sent. Responses
with a known length up to :data:`BUFFER_LIMIT` bytes are relayed in one write; everything
else (server-sent event streams in particular) is relayed chunk by chunk as it arrives.
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

import aiohttp
from aiohttp import web
from aiohttp.streams import StreamReader

from sessionroute.errors import NoWorkerAvailable
from sessionroute.routing import Reservation
from sessionroute.server.errors import error_response
from sessionroute.server.router import Router
from sessionroute.server.upstream import HOP_BY_HOP, Exchange, UpstreamConnectError
from sessionroute.state import extract_session_id
from sessionroute.types import RouteRequest

__all__ = ["BUFFER_LIMIT", "HOP_BY_HOP", "RETRY_STATUSES", "prompt_text", "proxy_request"]

log = logging.getLogger("sessionroute.server")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Upstream statuses that are retried (vllm-router's list)."""


_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "x-request-id", "date", "server"}

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


def _header_block(router: Router, request: web.BaseRequest) -> bytes:
    """The client's headers as received, minus the dropped ones, plus the worker credential."""
    known = router.header_fates
    out: list[bytes] = []
    for name, value in request.raw_headers:
        f = known.get(name)
        if f is None:
            f = router.header_fate(name)
        if f == 0:
            out += (name, b": ", value, b"\r\n")
        elif f == 2:  # Connection names more headers to drop (rare with HTTP/1.1 clients)
            return _header_block_connection(router, request)
    out.append(router.worker_auth)
    return b"".join(out)


def _header_block_connection(router: Router, request: web.BaseRequest) -> bytes:
    drop = set(router.request_drop)
    for name, value in request.raw_headers:
        if name.lower() == b"connection":
            drop.update(t.strip().lower() for t in value.split(b","))
    kept = [b"%s: %s\r\n" % kv for kv in request.raw_headers if kv[0].lower() not in drop]
    return b"".join(kept) + router.worker_auth


async def _read_body(content: StreamReader, length: int | None, limit: int) -> list[bytes] | None:
    """The request body as the pieces it arrived in (no joining copy), or None when it
    exceeds ``limit`` bytes.

    ``length`` is the request's Content-Length (checked against ``limit`` by the caller; the
    parser stops there), None for a chunked body, which is checked while it arrives.
    """
    parts: list[bytes] = []
    size = 0
    while True:
        chunk, _ = await content.readchunk()
        if not chunk:
            if content.at_eof():
                return parts
            continue  # the end of an HTTP chunk of a chunked body
        size += len(chunk)
        if length is None and size > limit:
            return None
        parts.append(chunk)


async def proxy_request(request: web.BaseRequest, router: Router) -> web.StreamResponse:
    """Handle one POST to a generation route (see the module docstring).

    Returns JSON errors: 413 over ``--max-payload-size``, 400 for malformed JSON when the policy
    parses the body, 503 when no worker is available, 502 when every attempt failed to connect,
    504 on upstream timeout; upstream error responses pass through.
    """
    s = router.settings
    headers = request.headers
    for name in s.request_id_headers:
        rid = headers.get(name)
        if rid:
            break
    else:
        rid = router.new_request_id(request.path)
    length = request.content_length
    limit = s.max_payload_size
    if length is not None and length > limit:
        return _too_large(length, limit, rid)
    content = request.content
    parts: list[bytes] | None
    if content.is_eof():  # all of it arrived with the headers (a join of one: no copy)
        data = content.read_nowait()
        parts = [data] if len(data) <= limit else None
    else:
        parts = await _read_body(content, length, limit)
    if parts is None:
        return _too_large(None, limit, rid)
    size = sum(map(len, parts)) if len(parts) != 1 else len(parts[0])
    found = extract_session_id(headers, s.session_headers)
    text: str | None = None
    model: str | None = None
    if router.needs_content:
        try:
            payload = json.loads(b"".join(parts))
        except (ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
            return error_response(
                400,
                f"request body is not valid JSON: {exc}",
                "malformed_json",
                headers={"x-request-id": rid},
            )
        text = prompt_text(payload)
        m = payload.get("model") if isinstance(payload, dict) else None
        model = m if isinstance(m, str) else None
    route_req = RouteRequest(
        session_id=found[1] if found else None,
        session_header=found[0] if found else "x-session-id",
        prompt_tokens=size // 4,
        text=text,
        model=model,
        request_id=rid,
    )
    core = router.core
    t0 = time.perf_counter()
    try:
        reservation = core.route(route_req)
    except NoWorkerAvailable as exc:
        return error_response(503, str(exc), "no_worker_available", headers={"x-request-id": rid})
    router.metrics.observe_routing(t0, time.perf_counter())
    holder = [reservation]
    try:
        return await _forward(request, router, holder, parts, size, rid)
    finally:
        core.complete(holder[0])


def _too_large(size: int | None, limit: int, rid: str) -> web.Response:
    got = f"{size} bytes" if size is not None else "more"
    return error_response(
        413,
        f"request body of {got} exceeds --max-payload-size of {limit} bytes",
        "payload_too_large",
        headers={"x-request-id": rid},
    )


async def _forward(
    request: web.BaseRequest,
    router: Router,
    holder: list[Reservation],
    parts: list[bytes],
    size: int,
    rid: str,
) -> web.StreamResponse:
    s = router.settings
    core = router.core
    metrics = router.metrics
    pool = router.upstream
    tail = _header_block(router, request) + b"Content-Length: %d\r\n\r\n" % size
    method = request.method
    path_qs = request.rel_url.raw_path_qs
    attempts = router.max_attempts
    last_error = ""
    task = asyncio.current_task()  # the handler's (request.task is the connection's)
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
                    return error_response(
                        503,
                        f"no worker available (last error: {last_error})",
                        "no_worker_available",
                        headers={"x-request-id": rid},
                    )
        worker = res.worker
        ex = Exchange(pool, worker, task)
        try:
            t0 = time.perf_counter()
            try:
                head = pool.heads.get((worker, method, path_qs)) or pool.request_head(
                    worker, method, path_qs
                )
                message = await ex.send((head + tail, *parts))
            except UpstreamConnectError as exc:
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                router.record_unreachable(worker, last_error)
                continue
            except aiohttp.ClientError as exc:  # reset, disconnect, malformed response
                last_error = f"{worker}: {type(exc).__name__}: {exc}"
                router.record_failure(worker)
                continue
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    raise
                router.record_failure(worker)
                metrics.count_request(worker, 504)
                return error_response(
                    504,
                    f"upstream {worker} did not answer within {s.request_timeout_secs} s",
                    "upstream_timeout",
                    headers={"x-request-id": rid},
                )
            metrics.observe_upstream(worker, t0, time.perf_counter())
            status = message.code
            if status >= 500:
                router.record_failure(worker)
            else:
                router.record_success(worker)
            if status in RETRY_STATUSES and attempt + 1 < attempts:
                if not await _drain(ex):
                    return _timeout_reading(router, worker, rid)
                last_error = f"{worker}: status {status}"
                continue
            return await _relay(request, router, ex, worker, rid)
        finally:
            ex.close()
    metrics.count_request(holder[0].worker, 502)
    return error_response(
        502,
        f"upstream unreachable after {attempts} attempt(s): {last_error}",
        "upstream_unreachable",
        headers={"x-request-id": rid},
    )


async def _drain(ex: Exchange) -> bool:
    """Read a (small) error body so the connection can be reused; False on timeout."""
    if ex.payload is None:
        return True
    try:
        await ex.payload.read()
    except aiohttp.ClientError:
        pass
    except asyncio.CancelledError:
        if not ex.is_timeout():
            raise
        return False
    return True


def _timeout_reading(router: Router, worker: str, rid: str) -> web.Response:
    router.record_failure(worker)
    router.metrics.count_request(worker, 502)
    return error_response(
        502,
        f"upstream {worker} failed while sending its response: timeout",
        "upstream_error",
        headers={"x-request-id": rid},
    )


async def _relay(
    request: web.BaseRequest,
    router: Router,
    ex: Exchange,
    worker: str,
    rid: str,
) -> web.StreamResponse:
    message = ex.message
    payload = ex.payload
    if message is None or payload is None:
        raise RuntimeError("relay before the response headers arrived")
    status = message.code
    metrics = router.metrics
    try:
        headers = [kv for kv in message.headers.items() if kv[0].lower() not in _RESPONSE_DROP]
        headers.append(("x-request-id", rid))
        raw_length = message.headers.get("Content-Length")
        length = int(raw_length) if raw_length is not None else None
        if length is not None and length <= BUFFER_LIMIT:
            try:
                data = payload.read_nowait() if payload.is_eof() else await payload.read()
            except aiohttp.ClientError as exc:
                router.record_failure(worker)
                metrics.count_request(worker, 502)
                return error_response(
                    502,
                    f"upstream {worker} failed while sending its response: {type(exc).__name__}",
                    "upstream_error",
                    headers={"x-request-id": rid},
                )
            except asyncio.CancelledError:
                if not ex.is_timeout():
                    raise
                return _timeout_reading(router, worker, rid)
            metrics.count_request(worker, status)
            return web.Response(status=status, reason=message.reason, body=data, headers=headers)
        resp = web.StreamResponse(status=status, reason=message.reason, headers=headers)
        if length is not None:
            resp.content_length = length
        await resp.prepare(request)
        try:
            async for chunk in payload.iter_any():
                await resp.write(chunk)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.CancelledError,
        ) as exc:
            if isinstance(exc, ConnectionResetError):
                raise  # the client went away: handled below
            if isinstance(exc, asyncio.CancelledError) and not ex.is_timeout():
                raise
            log.warning("upstream %s failed mid-response: %r", worker, exc)
            router.record_failure(worker)
            metrics.count_request(worker, 502)
            if request.transport is not None:
                request.transport.abort()  # no terminating chunk: the client sees truncation
            return resp
        await resp.write_eof()
        metrics.count_request(worker, status)
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        metrics.count_request(worker, 499)
        raise
