"""Hostile clients over raw sockets: broken chunked bodies, pipelining floods, header bytes
that are not UTF-8. Each must get a JSON error (or its answer), never a crash or a stall."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from .backend import FakeBackend
from .conftest import MakeRouter
from .test_server_http1 import _connect, _post, _response
from .test_server_upstream import OK_BODY, RawBackend, fixed


async def test_broken_chunked_body_gets_a_json_400(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """The handler waits for the body when its chunk framing breaks: a 400, not a reset."""
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nx-session-id: s\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    )
    status, headers, body = await _response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert "chunk size" in json.loads(body)["error"]["message"]
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert router.router.core.cluster.in_flight(backends[0].url) == 0
    assert not backends[0].seen


async def test_thousands_of_pipelined_requests_behind_a_proxied_one(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """Queued requests answered at once are started in a loop, not by recursion."""
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    n = 2000
    writer.write(_post() + b"GET /nope HTTP/1.1\r\nHost: r\r\n\r\n" * n)
    statuses = [(await _response(reader))[0] for _ in range(n + 1)]
    assert statuses == [200] + [404] * n
    writer.write(b"GET /liveness HTTP/1.1\r\nHost: r\r\n\r\n")
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_header_callback_errors_name_their_cause(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: r\r\n\r\n")
    status, _, body = await _response(reader)
    assert status == 431 and "over 64 KiB" in json.loads(body)["error"]["message"]
    writer.close()


async def test_session_and_request_ids_that_are_not_utf8(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """Ids are hashed as UTF-8: invalid bytes are replaced (as /finish_session decodes its
    query), never a 500; the id echoed back is the bytes received."""
    for policy in ("consistent_hash", "sticky_least_loaded"):
        router = await make_router([b.url for b in backends], policy=policy)
        for header in (b"x-session-id: \xff\xfe", b"x-request-id: \xff"):
            reader, writer = await _connect(router.port)
            writer.write(_post().replace(b"x-session-id: s", header))
            status, headers, _ = await _response(reader)
            assert status == 200, (policy, header)
            if header.startswith(b"x-request-id"):
                assert headers["x-request-id"] == "\xff"  # latin-1 view of the raw byte
            writer.close()
        core = router.router.core
        if policy == "sticky_least_loaded":
            assert core.policy.worker_of("\ufffd\ufffd") is not None
        reader, writer = await _connect(router.port)
        writer.write(b"POST /finish_session?session_id=%FF%FE HTTP/1.1\r\nHost: r\r\n\r\n")
        status, _, body = await _response(reader)
        assert status == 200 and json.loads(body)["session_id"] == "\ufffd\ufffd"
        writer.close()
        if policy == "sticky_least_loaded":
            assert core.policy.worker_of("\ufffd\ufffd") is None


@pytest.fixture
async def worker() -> AsyncIterator[RawBackend]:
    backend = await RawBackend().start()
    yield backend
    await backend.stop()


SMUGGLED = b"HTTP/1.1 200 OK\r\nX-Evil: 1\r\nContent-Length: 7\r\n\r\nSMUGGLE"


@pytest.mark.parametrize("extra", [SMUGGLED, b"H", b"HTTP/1.1 200", b"HTTP/1.1 200 OK\r\n"])
@pytest.mark.parametrize("separate", [False, True])
async def test_a_second_response_to_one_request_is_not_relayed(
    extra: bytes, separate: bool, worker: RawBackend, make_router: MakeRouter
) -> None:
    """A worker that answers twice must not splice its second answer's headers and body into
    the first or the next: bytes of a response the router did not ask for, after a complete
    one (in the same packet or later, while the connection is idle; even a status line cut
    short, before any of its fields), close the connection, and the next request goes on a
    new one."""
    first: list[bytes] = [fixed(), extra] if separate else [fixed() + extra]
    answers: list[bytes | list[bytes]] = [first, fixed(b'{"second": true}')]
    worker.respond = lambda head: (answers.pop(0), False)
    worker.pause_s = 0.1  # separate: the stray bytes come once the router answered the client
    router = await make_router([worker.url])
    reader, writer = await _connect(router.port)
    writer.write(_post())
    status, headers, body = await _response(reader)
    assert status == 200 and "x-evil" not in headers and body == OK_BODY
    await asyncio.sleep(0.3)  # the stray bytes have reached the router
    opened = worker.connections
    writer.write(_post())
    status, headers, body = await _response(reader)
    assert status == 200 and "x-evil" not in headers and body == b'{"second": true}'
    assert worker.connections == opened + 1  # the desynchronized connection was not reused
    writer.close()


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_statuses_are_relayed_without_framing(
    status: int, worker: RawBackend, make_router: MakeRouter
) -> None:
    """A 204/304 has no body: no chunked framing (a stray ``0\\r\\n\\r\\n`` would be read as
    the next response on the client's keep-alive connection)."""
    worker.respond = lambda head: (b"HTTP/1.1 %d X\r\n\r\n" % status, False)
    router = await make_router([worker.url])
    reader, writer = await _connect(router.port)
    writer.write(_post() + b"GET /liveness HTTP/1.1\r\nHost: r\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 %d " % status)
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
    status2, _, body = await _response(reader)  # the next answer follows at once
    assert status2 == 200 and json.loads(body) == {"status": "alive"}
    writer.close()
    assert router.router.core.cluster.in_flight(worker.url) == 0


async def test_an_upgrade_answer_from_a_worker_is_a_502(
    worker: RawBackend, make_router: MakeRouter
) -> None:
    worker.respond = lambda head: (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nxx",
        True,
    )
    router = await make_router([worker.url], retry_max_retries=2)
    reader, writer = await _connect(router.port)
    writer.write(_post())
    status, _, body = await _response(reader)
    assert status == 502 and "101" in json.loads(body)["error"]["message"]
    writer.close()
    assert router.router.core.cluster.in_flight(worker.url) == 0


async def test_client_gone_before_the_answer_counts_499_and_releases(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    b = backends[0]
    b.hold = asyncio.Event()
    router = await make_router([b.url], policy="sticky_least_loaded")
    core = router.router.core
    reader, writer = await _connect(router.port)
    writer.write(_post())
    while not b.seen:  # the request reached the worker, which holds its answer
        await asyncio.sleep(0.005)
    assert core.cluster.in_flight(b.url) == 1
    writer.transport.abort()
    while core.cluster.in_flight(b.url):
        await asyncio.sleep(0.005)
    text = router.router.metrics.render().decode()
    assert f'sessionroute_requests_total{{status="499",worker="{b.url}"}} 1.0' in text
    b.hold.set()
    reader, writer = await _connect(router.port)  # the router serves on
    writer.write(_post())
    assert (await _response(reader))[0] == 200
    writer.close()
    assert core.cluster.in_flight(b.url) == 0


@pytest.mark.parametrize("status", [200, 503])
async def test_a_body_that_stalls_past_the_timeout_is_a_504(
    status: int, worker: RawBackend, make_router: MakeRouter
) -> None:
    """The head came, the (small, buffered) body never ends: an upstream timeout (504) both
    when relaying it and when draining a retried 503, as for a head that never comes."""
    worker.respond = lambda head: (b"HTTP/1.1 %d X\r\nContent-Length: 100\r\n\r\n{" % status, False)
    router = await make_router([worker.url], request_timeout_secs=0.2, retry_max_retries=2)
    reader, writer = await _connect(router.port)
    writer.write(_post())
    got, _, body = await _response(reader)
    assert got == 504 and json.loads(body)["error"]["code"] == "upstream_timeout"
    writer.close()
    assert router.router.core.cluster.in_flight(worker.url) == 0


async def test_oversize_chunked_body_message_reads_well(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url], max_payload_size=1000)
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
        + (b"3e8\r\n" + b"a" * 1000 + b"\r\n") * 2
        + b"0\r\n\r\n"
    )
    status, _, body = await _response(reader)
    assert status == 413
    assert json.loads(body)["error"]["message"] == (
        "request body of over 1000 bytes exceeds --max-payload-size of 1000 bytes"
    )
    writer.close()


@pytest.mark.parametrize("headers", [1, 2000])
async def test_a_worker_head_that_never_ends_is_a_502(
    headers: int, worker: RawBackend, make_router: MakeRouter
) -> None:
    """A worker that streams headers without end (one huge one, or thousands of small ones)
    is cut off at the head limit with a 502, not buffered until the request times out."""
    pad = b"X-Pad: " + b"a" * (70_000 // headers) + b"\r\n"
    worker.respond = lambda head: (b"HTTP/1.1 200 OK\r\n" + pad * headers, False)
    router = await make_router([worker.url])
    reader, writer = await _connect(router.port)
    writer.write(_post())
    status, _, body = await asyncio.wait_for(_response(reader), 10)
    assert status == 502
    assert "response head over 65536 bytes" in json.loads(body)["error"]["message"]
    writer.close()
    assert router.router.core.cluster.in_flight(worker.url) == 0


async def test_a_retried_error_body_that_never_ends_does_not_hold_the_retry(
    worker: RawBackend, make_router: MakeRouter
) -> None:
    """A 503 whose chunked body never ends is not read before the retry: its connection is
    closed and the retry (on a new connection) answers at once."""
    endless = b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nbusy!\r\n"
    answers = [endless, fixed()]
    worker.respond = lambda head: (answers.pop(0), False)
    router = await make_router([worker.url], retry_max_retries=2)
    reader, writer = await _connect(router.port)
    writer.write(_post())
    status, _, body = await asyncio.wait_for(_response(reader), 10)
    assert status == 200 and body == OK_BODY
    assert len(worker.heads) == 2  # the 503, then the retry
    writer.close()


@pytest.mark.parametrize("extra", [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"H"])
async def test_a_second_response_on_a_reused_connection_is_not_relayed(
    extra: bytes, worker: RawBackend, make_router: MakeRouter
) -> None:
    """A second response (or its first byte) in the read that completes the first, on a
    kept-alive connection (the answer driven by callbacks, inline): the first answer reaches
    the client at once rather than at the request timeout, the rest is dropped with the
    connection."""
    answers = [fixed(), fixed(b'{"two": 2}') + extra, fixed(b'{"three": 3}')]
    worker.respond = lambda head: (answers.pop(0), False)
    router = await make_router([worker.url])
    reader, writer = await _connect(router.port)
    opened = 0
    for expected in (OK_BODY, b'{"two": 2}', b'{"three": 3}'):
        opened = worker.connections
        writer.write(_post())
        status, _, body = await asyncio.wait_for(_response(reader), 5)
        assert status == 200 and body == expected
    assert worker.connections == opened + 1  # the desynchronized connection was not reused
    writer.close()


EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"


@pytest.mark.parametrize(
    ("pieces", "close"),
    [
        ([EARLY_HINTS + fixed(b'{"n": 2}', b"X-Final: 1\r\n")], False),  # one read
        ([EARLY_HINTS[:20], EARLY_HINTS[20:], fixed(b'{"n": 2}', b"X-Final: 1\r\n")], False),
        (  # byte by byte
            [bytes([c]) for c in b"HTTP/1.1 100 Continue\r\n\r\n" + fixed(b'{"n": 2}')],
            False,
        ),
        (  # HTTP/1.0 without a length: the body ends with the connection
            [b"HTTP/1.0 200 Fine\r\nContent-Type: application/json\r\n\r\n", b'{"n": 2}'],
            True,
        ),
    ],
)
async def test_interim_split_and_close_delimited_answers_on_a_reused_connection(
    pieces: list[bytes], close: bool, worker: RawBackend, make_router: MakeRouter
) -> None:
    """The second request of a client goes on the worker's kept-alive connection (driven by
    callbacks): an interim answer's headers and reason are not relayed, an answer arriving in
    several reads is relayed whole, and one delimited by the close is too; the next request
    is answered after each."""
    answers: list[tuple[bytes | list[bytes], bool]] = [
        (fixed(b'{"n": 1}'), False),
        (pieces, close),
        (fixed(b'{"n": 3}'), False),
    ]
    worker.respond = lambda head: answers.pop(0)
    router = await make_router([worker.url])
    reader, writer = await _connect(router.port)
    for n in (1, 2, 3):
        writer.write(_post())
        status, headers, body = await asyncio.wait_for(_response(reader), 5)
        assert (status, json.loads(body)) == (200, {"n": n})
        assert "link" not in headers
        if n == 2 and b"X-Final" in pieces[-1]:
            assert headers["x-final"] == "1"
    if pieces[0].startswith(b"HTTP/1.1 103"):
        assert len(worker.heads) == 3
    writer.close()
