"""KV events over real ZMQ sockets on 127.0.0.1: the subscriber's gap handling (replay or clear)
and kv_aware routing through the live router on the index the events built."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
import zmq
import zmq.asyncio

from sessionroute.errors import ConfigError
from sessionroute.router.kv.content import load_kv_content
from sessionroute.router.kv.events import (
    END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    encode_batch,
    encode_seq,
)
from sessionroute.router.kv.index import KvIndex
from sessionroute.serve.config import KvStreamConfig, RouterSettings
from sessionroute.serve.kvevents import KvEventSubscriber
from sessionroute.serve.router import Router

from .backend import FakeBackend
from .conftest import MakeRouter

FIXTURES = Path(__file__).parents[1] / "router" / "kv" / "fixtures"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stored(*hashes: int) -> KVEventBatch:
    return KVEventBatch(1.0, (BlockStored(tuple(hashes), None, (0,) * len(hashes), 1),))


def _msg(seq: int, batch: KVEventBatch) -> list[bytes]:
    return [b"", encode_seq(seq), encode_batch(batch)]


async def _until(cond: Callable[[], bool], pub: zmq.asyncio.Socket | None = None,
                 resend: list[bytes] | None = None) -> None:  # fmt: skip
    """Wait (bounded) for ``cond``; resend ``resend`` meanwhile (ZMQ drops messages published
    before the connection is up)."""
    for _ in range(500):
        if cond():
            return
        if pub is not None and resend is not None:
            await pub.send_multipart(resend)
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in 5 s")


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    c = zmq.asyncio.Context()
    yield c
    c.destroy(linger=0)


async def _subscriber(
    ctx: zmq.asyncio.Context, replay: str | None = None
) -> tuple[KvEventSubscriber, zmq.asyncio.Socket, asyncio.Task[None]]:
    endpoint = f"tcp://127.0.0.1:{_port()}"
    sub = KvEventSubscriber(
        KvStreamConfig("http://w", endpoint, replay), KvIndex(), ctx, replay_timeout_s=1.0
    )
    sub.bind()
    task = asyncio.create_task(sub.run())
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)  # vLLM's publisher connects to the router's bound address
    first = _msg(0, _stored(1, 2))
    await _until(lambda: sub.index.last_seq("http://w") == 0, pub, first)
    return sub, pub, task


async def _stop(task: asyncio.Task[None], pub: zmq.asyncio.Socket) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pub.close(0)


async def test_gap_without_replay_clears_and_relearns(ctx: zmq.asyncio.Context) -> None:
    sub, pub, task = await _subscriber(ctx)
    index = sub.index
    assert index.matched_blocks([1, 2], ["http://w"]) == {"http://w": 2}
    await pub.send_multipart(_msg(1, _stored(3)))
    await _until(lambda: index.last_seq("http://w") == 1)
    assert index.size("http://w") == 3
    await pub.send_multipart(_msg(4, _stored(9)))  # 2 and 3 were lost
    await _until(lambda: index.last_seq("http://w") == 4)
    assert index.stats["http://w"].gaps == 1
    assert sub.resyncs == {"replay": 0, "clear": 1, "restart": 0}
    assert index.holds("http://w", 9) and index.size("http://w") == 1
    await pub.send_multipart(_msg(3, _stored(5)))  # late duplicate: ignored
    await pub.send_multipart(_msg(5, _stored(6)))
    await _until(lambda: index.last_seq("http://w") == 5)
    assert not index.holds("http://w", 5)
    await pub.send_multipart([b"", encode_seq(6), b"\xc1"])  # undecodable: counted, dropped
    await pub.send_multipart(_msg(0, _stored(7)))  # seq 0 again: the publisher restarted
    await _until(lambda: sub.resyncs["restart"] == 1)
    assert sub.decode_errors == 1
    assert index.size("http://w") == 1 and index.holds("http://w", 7)
    await _stop(task, pub)


@pytest.mark.parametrize("topic_frame", [True, False], ids=["vllm-with-topic", "without-topic"])
async def test_gap_is_filled_from_the_replay_socket(
    ctx: zmq.asyncio.Context, topic_frame: bool
) -> None:
    # vLLM 0.32's replay replies carry the topic (["", topic, seq, payload] at the DEALER);
    # older vLLM and SGLang send ["", seq, payload]
    topic = [b""] if topic_frame else []
    replay_addr = f"tcp://127.0.0.1:{_port()}"
    router = ctx.socket(zmq.ROUTER)  # vLLM's replay socket: a ROUTER the server binds
    router.setsockopt(zmq.LINGER, 0)
    router.bind(replay_addr)
    buffered = {1: _stored(3), 2: KVEventBatch(1.0, (AllBlocksCleared(),)), 3: _stored(4)}
    requests: list[int] = []

    async def serve_replay() -> None:
        while True:
            client, _empty, start = await router.recv_multipart()
            requests.append(int.from_bytes(start, "big"))
            for seq, ev in buffered.items():
                if seq >= requests[-1]:
                    await router.send_multipart(
                        [client, b"", *topic, encode_seq(seq), encode_batch(ev)]
                    )
            await router.send_multipart([client, b"", *topic, encode_seq(END_SEQ), b""])

    replay_task = asyncio.create_task(serve_replay())
    sub, pub, task = await _subscriber(ctx, replay_addr)
    index = sub.index
    await pub.send_multipart(_msg(4, _stored(5)))  # 1..3 lost on the way
    await _until(lambda: index.last_seq("http://w") == 4)
    assert requests == [1]
    assert sub.resyncs["replay"] == 1 and sub.resyncs["clear"] == 0
    # replayed in order: +3, cleared, +4; then the live batch +5
    assert [index.holds("http://w", h) for h in (1, 2, 3, 4, 5)] == [0, 0, 0, 1, 1]
    await _stop(task, pub)
    replay_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await replay_task
    router.close(0)


@pytest.mark.parametrize("policy", ["kv_aware", "kv_cost"])
async def test_kv_aware_routes_to_the_worker_holding_the_prompt(
    backends: list[FakeBackend], make_router: MakeRouter, ctx: zmq.asyncio.Context, policy: str
) -> None:
    """kv_aware and kv_cost (Dynamo's cost) read the index serve feeds from KV events."""
    urls = [b.url for b in backends]
    endpoints = {u: f"tcp://127.0.0.1:{_port()}" for u in urls}
    router = await make_router(
        urls,
        policy=policy,
        kv_tokenizer=str(FIXTURES),
        kv_block_size=32,
        kv_events=tuple(f"{u}={e}" for u, e in endpoints.items()),
    )
    system = "You are a careful software engineer. Fix the failing test. " * 12
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Task 7: make the build green"},
        ],
    }
    hashes = load_kv_content(str(FIXTURES), 32).blocks(body)
    assert len(hashes) >= 10
    holder = urls[1]
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoints[holder])
    index = router.router.kv_index
    assert index is not None
    batch = KVEventBatch(1.0, (BlockStored(tuple(hashes), None, (0,) * 32 * len(hashes), 32),))
    await _until(lambda: index.size(holder) == len(hashes), pub, _msg(0, batch))
    async with aiohttp.ClientSession() as client:
        for _ in range(3):  # no session id: the cache state alone decides
            async with client.post(router.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        async with client.get(router.url + "/metrics") as resp:
            text = await resp.text()
    assert [len(b.seen) for b in backends] == [0, 3, 0]
    assert f'sessionroute_kv_index_blocks{{worker="{holder}"}} {float(len(hashes))}' in text
    assert f'sessionroute_kv_event_batches_total{{worker="{holder}"}} 1.0' in text
    pub.close(0)


@pytest.mark.parametrize(
    "spec",
    [
        "tcp://127.0.0.1:5557",
        "http://a:1=nowhere",
        "http://a:1=tcp://127.0.0.1:5557,replay",
        "ftp://a=tcp://127.0.0.1:5557",
    ],
)
def test_bad_kv_events_flags_are_named(spec: str) -> None:
    with pytest.raises(ConfigError, match="kv-events"):
        RouterSettings.build(kv_events=(spec,))


def test_kv_events_need_a_policy_that_reads_them() -> None:
    s = RouterSettings.build(
        worker_urls=("http://a:1",),
        policy="round_robin",
        kv_events=("http://a:1=tcp://127.0.0.1:5557",),
    )
    with pytest.raises(ConfigError, match="does not read KV events"):
        Router(s)
    twice = ("http://a:1=tcp://127.0.0.1:1", "http://a:1=tcp://127.0.0.1:2")
    with pytest.raises(ConfigError, match="twice"):
        RouterSettings.build(kv_events=twice)
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        Router(RouterSettings.build(policy="kv_aware", kv_tokenizer="/nonexistent"))
