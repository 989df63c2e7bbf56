"""Input validation before placement, under every policy: a bad request gets a 4xx JSON error,
reaches no worker and pins nothing (issue 19, "Must hold")."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from .backend import FakeBackend
from .conftest import MakeRouter, chat, post_chat
from .test_server_http1 import _connect, _response

POLICIES = ["consistent_hash", "sticky_least_loaded", "round_robin", "cache_aware"]

_MSG = b'"messages": [{"role": "user", "content": '
BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("truncated", b'{"model": "m", "messages": [', "malformed_json"),
    ("empty", b"", "malformed_json"),
    ("not utf-8", b'{"model": "m", ' + _MSG + b'"\xff\xfe"}]}', "malformed_json"),
    ("lone surrogate", b'{"model": "m", ' + _MSG + b'"\\ud800"}]}', "malformed_json"),
    ("trailing bytes", json.dumps(chat()).encode() + b"}", "malformed_json"),
    ("NaN", b'{"model": "m", "temperature": NaN, ' + _MSG + b'"x"}]}', "malformed_json"),
    ("a list", b"[1, 2]", "invalid_request"),
    ("no messages", b'{"model": "m"}', "invalid_request"),
    ("empty messages", b'{"model": "m", "messages": []}', "invalid_request"),
    ("message not an object", b'{"model": "m", "messages": ["hi"]}', "invalid_request"),
    ("message without role", b'{"model": "m", "messages": [{"content": "hi"}]}', "invalid_request"),
    ("model a number", b'{"model": 3, "messages": [{"role": "user"}]}', "invalid_request"),
]


def _pinned(router: object, sid: str) -> str | None:
    return router.router.core.policy.worker_of(sid)  # type: ignore[attr-defined, no-any-return]


@pytest.mark.parametrize("policy", POLICIES)
async def test_bad_bodies_get_400_and_pin_nothing(
    policy: str, backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy=policy)
    for name, body, code in BAD_BODIES:
        sid = f"bad-{name}"
        async with client.post(
            router.url + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "x-session-id": sid},
        ) as r:
            assert r.status == 400, name
            assert r.content_type == "application/json"
            error = (await r.json())["error"]
        assert error["code"] == code, (name, error)
        assert error["type"] == "invalid_request_error"
        assert _pinned(router, sid) is None, name
    assert not any(b.seen for b in backends)
    assert sum(router.router.core.decisions.values()) == 0
    # the same router still serves a good request
    async with client.post(
        router.url + "/v1/chat/completions", json=chat(), headers={"x-session-id": "good"}
    ) as r:
        assert r.status == 200


@pytest.mark.parametrize(
    ("path", "good", "bad"),
    [
        ("/v1/completions", {"model": "m", "prompt": "hi"}, {"model": "m", "prompt": 3}),
        ("/v1/completions", {"model": "m", "prompt": [1, 2]}, {"model": "m", "prompt": []}),
        ("/v1/embeddings", {"model": "m", "input": ["a"]}, {"model": "m"}),
        ("/v1/responses", {"model": "m", "input": "hi"}, {"model": "m", "input": None}),
    ],
)
async def test_route_shapes(
    path: str,
    good: dict[str, object],
    bad: dict[str, object],
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([backends[0].url])
    async with client.post(router.url + path, json=bad) as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "invalid_request"
    assert not backends[0].seen
    async with client.post(router.url + path, json=good) as r:
        assert r.status != 400


async def test_content_types(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], policy="consistent_hash")
    body = json.dumps(chat()).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"x-session-id": "ct"}
        if ctype is not None:
            headers["Content-Type"] = ctype
        async with client.post(
            router.url + "/v1/chat/completions",
            data=body,
            headers=headers,
            skip_auto_headers=("Content-Type",),
        ) as r:
            assert r.status == 415, ctype
            assert (await r.json())["error"]["code"] == "unsupported_media_type"
    assert not backends[0].seen and _pinned(router, "ct") is None
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"):
        async with client.post(
            router.url + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": ctype, "x-session-id": "ct"},
        ) as r:
            assert r.status == 200, ctype


async def test_session_ids_too_long_or_with_control_characters(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url], policy="sticky_least_loaded")
    body = json.dumps(chat()).encode()
    for sid, status in ((b"x" * 60_000, 400), (b"a\x01b", 400), (b"y" * 256, 200)):
        reader, writer = await _connect(router.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
            b"x-session-id: " + sid + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        got, _, answer = await _response(reader)
        writer.close()
        assert got == status, sid[:10]
        if status == 400:  # llhttp already refuses a control character in a header value
            message = json.loads(answer)["error"]["message"]
            assert "session id" in message or "header value char" in message
    assert len(backends[0].seen) == 1
    assert len(router.router.core.policy.table) == 1  # type: ignore[attr-defined]


async def test_the_session_table_is_bounded_in_bytes_as_well_as_entries(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    from sessionroute.router.state.sessions import entry_bytes

    limit = 4 * entry_bytes("y" * 200)  # room for 4 long ids, or more short ones
    router = await make_router(
        [backends[0].url], policy="sticky_least_loaded", session_table_max_bytes=limit
    )
    table = router.router.core.policy.table  # type: ignore[attr-defined]
    assert table.max_bytes == limit
    for i in range(10):
        status, _ = await post_chat(client, router, f"{i:03d}" + "y" * 197)
        assert status == 200
    assert len(table) == 4 and table.nbytes <= limit
    assert table.worker_of("009" + "y" * 197) is not None  # the most recent ones stay
    assert table.worker_of("000" + "y" * 197) is None  # the least recently used went first
    async with client.get(router.url + "/metrics") as r:
        text = await r.text()
    assert f"sessionroute_session_table_bytes {float(table.nbytes)}" in text
    assert "sessionroute_sessions_evicted_total 6.0" in text


async def test_a_1mb_header_gets_431_not_a_reset(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Big: "
        + b"a" * (1 << 20)
        + b"\r\nContent-Length: 2\r\n\r\n{}"
    )
    status, headers, body = await _response(reader)
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "header_too_large"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # a clean close (FIN), no reset
    writer.close()
    assert not backends[0].seen


async def test_oversize_body_is_413_without_buffering(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url], max_payload_size=1000)
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000000\r\n\r\n" + b"x" * 4096
    )
    status, _, body = await _response(reader)
    assert status == 413 and json.loads(body)["error"]["code"] == "payload_too_large"
    (conn,) = router.listener.connections
    assert conn._current is None or not conn._current.parts  # nothing of the body kept
    writer.close()
    assert not backends[0].seen
