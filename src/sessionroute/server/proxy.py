"""Proxying one generation request: route, forward, retry, relay, release.

The body is read once and forwarded as received; it is parsed only when the policy reads the
prompt (``Policy.needs_content``). Responses with a known length up to
:data:`BUFFER_LIMIT` bytes are relayed in one write; everything else (server-sent event
streams in particular) is relayed chunk by chunk as it arrives. Retries (on
:data:`RETRY_STATUSES` and connection errors, with exponential backoff and jitter) happen only
before the first byte of a response is sent to the client. A worker that refuses connections
is marked unavailable at once, so the next attempt re-places the session. The policy's
reservation is released exactly once on every path (``try/finally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from sessionroute.errors import NoWorkerAvailable
from sessionroute.routing import Reservation
from sessionroute.server.errors import error_response
from sessionroute.server.router import Router
from sessionroute.state import extract_session_id
from sessionroute.types import RouteRequest

__all__ = ["BUFFER_LIMIT", "HOP_BY_HOP", "RETRY_STATUSES", "prompt_text", "proxy_request"]

log = logging.getLogger("sessionroute.server")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Upstream statuses that are retried (vllm-router's list)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers never forwarded in either direction (RFC 9110 section 7.6.1)."""

_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length"}
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


def _request_id(router: Router, request: web.Request) -> str:
    headers = request.headers
    for name in router.settings.request_id_headers:
        value = headers.get(name)
        if value:
            return value
    return router.new_request_id(request.path)


def _upstream_headers(router: Router, headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    drop = _REQUEST_DROP
    conn = headers.get("connection")
    if conn:
        drop = drop | {t.strip().lower() for t in conn.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in drop:
            out.add(k, v)
    if router.settings.router_api_key is not None:
        out.popall("Authorization", None)  # the router's credential, not the worker's
    for k, v in router.worker_headers.items():
        out[k] = v
    return out


def _response_headers(upstream: aiohttp.ClientResponse, rid: str) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in upstream.headers.items():
        if k.lower() not in _RESPONSE_DROP:
            out.add(k, v)
    out["x-request-id"] = rid
    return out


async def proxy_request(request: web.Request, router: Router) -> web.StreamResponse:
    """Handle one POST to a generation route (see the module docstring).

    Returns JSON errors: 413 over ``--max-payload-size``, 400 for malformed JSON when the policy
    parses the body, 503 when no worker is available, 502 when every attempt failed to connect,
    504 on upstream timeout; upstream error responses pass through.
    """
    s = router.settings
    rid = _request_id(router, request)
    rid_header = {"x-request-id": rid}
    if request.content_length is not None and request.content_length > s.max_payload_size:
        return _too_large(request.content_length, s.max_payload_size, rid_header)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _too_large(None, s.max_payload_size, rid_header)
    found = extract_session_id(request.headers, s.session_headers)
    text: str | None = None
    model: str | None = None
    if router.needs_content:
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
            return error_response(
                400,
                f"request body is not valid JSON: {exc}",
                "malformed_json",
                headers=rid_header,
            )
        text = prompt_text(payload)
        m = payload.get("model") if isinstance(payload, dict) else None
        model = m if isinstance(m, str) else None
    route_req = RouteRequest(
        session_id=found[1] if found else None,
        session_header=found[0] if found else "x-session-id",
        prompt_tokens=len(body) // 4,
        text=text,
        model=model,
        request_id=rid,
    )
    core = router.core
    t0 = time.perf_counter()
    try:
        reservation = core.route(route_req)
    except NoWorkerAvailable as exc:
        return error_response(503, str(exc), "no_worker_available", headers=rid_header)
    router.metrics.routing_seconds.observe(time.perf_counter() - t0)
    holder = [reservation]
    try:
        return await _forward(request, router, holder, body, rid)
    finally:
        core.complete(holder[0])


def _too_large(size: int | None, limit: int, headers: dict[str, str]) -> web.Response:
    got = f"{size} bytes" if size is not None else "more"
    return error_response(
        413,
        f"request body of {got} exceeds --max-payload-size of {limit} bytes",
        "payload_too_large",
        headers=headers,
    )


async def _forward(
    request: web.Request,
    router: Router,
    holder: list[Reservation],
    body: bytes,
    rid: str,
) -> web.StreamResponse:
    s = router.settings
    core = router.core
    metrics = router.metrics
    session = router.session
    headers = _upstream_headers(router, request.headers)
    method = request.method
    path_qs = request.rel_url.raw_path_qs
    attempts = s.max_attempts
    last_error = ""
    for attempt in range(attempts):
        res = holder[0]
        if attempt:
            metrics.retries.labels(res.worker).inc()
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
        t0 = time.perf_counter()
        try:
            upstream = await session.request(
                method, router.upstream_url(worker, path_qs), data=body, headers=headers
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            last_error = f"{worker}: {type(exc).__name__}: {exc}"
            router.record_unreachable(worker, last_error)
            continue
        except TimeoutError:
            router.record_failure(worker)
            metrics.count_request(worker, 504)
            return error_response(
                504,
                f"upstream {worker} did not answer within {s.request_timeout_secs} s",
                "upstream_timeout",
                headers={"x-request-id": rid},
            )
        except aiohttp.ClientError as exc:  # reset, disconnect, malformed response
            last_error = f"{worker}: {type(exc).__name__}: {exc}"
            router.record_failure(worker)
            continue
        metrics.observe_upstream(worker, time.perf_counter() - t0)
        status = upstream.status
        if status >= 500:
            router.record_failure(worker)
        else:
            router.record_success(worker)
        if status in RETRY_STATUSES and attempt + 1 < attempts:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await upstream.read()  # small error body; keeps the connection reusable
            upstream.release()
            last_error = f"{worker}: status {status}"
            continue
        return await _relay(request, router, upstream, worker, rid)
    metrics.count_request(holder[0].worker, 502)
    return error_response(
        502,
        f"upstream unreachable after {attempts} attempt(s): {last_error}",
        "upstream_unreachable",
        headers={"x-request-id": rid},
    )


async def _relay(
    request: web.Request,
    router: Router,
    upstream: aiohttp.ClientResponse,
    worker: str,
    rid: str,
) -> web.StreamResponse:
    status = upstream.status
    metrics = router.metrics
    try:
        headers = _response_headers(upstream, rid)
        length = upstream.content_length
        if length is not None and length <= BUFFER_LIMIT:
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                router.record_failure(worker)
                metrics.count_request(worker, 502)
                return error_response(
                    502,
                    f"upstream {worker} failed while sending its response: {type(exc).__name__}",
                    "upstream_error",
                    headers={"x-request-id": rid},
                )
            metrics.count_request(worker, status)
            return web.Response(status=status, reason=upstream.reason, body=data, headers=headers)
        resp = web.StreamResponse(status=status, reason=upstream.reason, headers=headers)
        if length is not None:
            resp.content_length = length
        await resp.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
            if isinstance(exc, ConnectionResetError):
                raise  # the client went away: handled below
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
    finally:
        upstream.close()
