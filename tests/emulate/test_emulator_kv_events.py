"""The emulator publishes its replica model's KV cache events over ZMQ as vLLM does, and serve's
kv_aware index, fed by them, matches the block hashes it computes from requests."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio
from test_emulator_support import FAST, MODEL, user, words

from sessionroute.emulate import start_emulator, stop_all
from sessionroute.emulate.kvevents import KvEventsConfig, offset_endpoint_port
from sessionroute.errors import ConfigError
from sessionroute.experiments.live.procs import free_port_block
from sessionroute.router.kv.content import load_kv_content
from sessionroute.router.kv.events import decode_batch, decode_seq, encode_seq
from sessionroute.router.kv.index import KvIndex
from sessionroute.serve import RouterSettings, start_router
from sessionroute.serve.config import KvStreamConfig
from sessionroute.serve.kvevents import KvEventSubscriber


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kv(endpoint: str, replay: str | None = None) -> KvEventsConfig:
    fields: dict[str, Any] = {"enable_kv_cache_events": True, "publisher": "zmq"}
    fields["endpoint"] = endpoint
    if replay is not None:
        fields["replay_endpoint"] = replay
    return KvEventsConfig.from_json(json.dumps(fields))


def test_config_parsing_and_port_offsets() -> None:
    cfg = _kv("tcp://127.0.0.1:5557")
    assert cfg.publishing and cfg.topic == "" and cfg.buffer_steps == 10_000
    assert not KvEventsConfig.from_json("{}").publishing  # vLLM: events off by default
    assert not KvEventsConfig.from_json(
        '{"enable_kv_cache_events": true, "publisher": "null"}'
    ).publishing
    assert offset_endpoint_port("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    for bad in ("[]", "nope", '{"publisher": "kafka"}', '{"buffer_steps": 0}', '{"hwm": "x"}'):
        with pytest.raises(ConfigError):
            KvEventsConfig.from_json(bad)


async def test_frames_are_vllms_and_hashes_match_the_routers() -> None:
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    endpoint = f"tcp://127.0.0.1:{_port()}"
    replay = f"tcp://127.0.0.1:{_port()}"
    sub.bind(endpoint)  # the subscriber binds; the emulator's PUB connects, as vLLM's
    h = await start_emulator(dataclasses.replace(FAST, kv_events=_kv(endpoint, replay)))
    try:
        # a SUB socket subscribes once its thread calls into it: receive before publishing
        pending = asyncio.ensure_future(sub.recv_multipart())
        await asyncio.sleep(0.2)  # ZMQ drops what is published before the connection is up
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "system", "content": words(200, "sys")}, user("go")],
            "max_tokens": 20,
        }
        async with httpx.AsyncClient() as client:
            r = await client.post(h.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200
        frames = await asyncio.wait_for(pending, 5.0)
        assert len(frames) == 3 and frames[0] == b"" and len(frames[1]) == 8
        assert decode_seq(frames[1]) == 0
        raw = msgpack.unpackb(frames[2], raw=False)
        assert raw[2] == 0 and raw[1][0]["type"] == "BlockStored"  # vLLM 0.32's layout
        stored = [h for e in decode_batch(frames[2]).events for h in getattr(e, "block_hashes", ())]
        event = decode_batch(frames[2]).events[0]
        assert getattr(event, "block_size", 0) == 16 and len(
            getattr(event, "token_ids", ())
        ) == 16 * len(getattr(event, "block_hashes", ()))
        router_hashes = load_kv_content("emulator", 16).blocks(body)
        assert len(router_hashes) >= 12
        assert stored[: len(router_hashes)] == router_hashes
        # the replay socket answers with the buffered batches, then seq -1
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        await dealer.send_multipart([b"", encode_seq(0)])
        first = await asyncio.wait_for(dealer.recv_multipart(), 5.0)
        # vLLM 0.32's replay reply: ["", topic, seq, payload]; the end marker ["", "", -1, ""]
        assert first[:2] == [b"", frames[0]] and decode_seq(first[2]) == 0
        assert first[3] == frames[2]
        while True:
            reply = await asyncio.wait_for(dealer.recv_multipart(), 5.0)
            assert len(reply) == 4
            if decode_seq(reply[2]) == -1:
                assert reply[1] == reply[3] == b""
                break
        dealer.close(0)
    finally:
        await stop_all([h])
        sub.close(0)
        ctx.destroy(linger=0)


async def test_a_late_subscriber_replays_what_the_emulator_published_before_it() -> None:
    """The router's subscriber and the emulator's replay socket agree on the reply frames: the
    batches published before the router's SUB socket was bound (lost on the PUB socket, as with
    a router that starts after its servers) are fetched from the replay socket."""
    ctx = zmq.asyncio.Context()
    endpoint, replay = f"tcp://127.0.0.1:{_port()}", f"tcp://127.0.0.1:{_port()}"
    h = await start_emulator(dataclasses.replace(FAST, kv_events=_kv(endpoint, replay)))
    index = KvIndex()
    sub = KvEventSubscriber(KvStreamConfig(h.url, endpoint, replay), index, ctx)
    task: asyncio.Task[None] | None = None
    bodies = [
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": words(200, f"s{i}-")}, user("go")],
            "max_tokens": 4,
        }
        for i in range(2)
    ]
    blocks = [load_kv_content("emulator", 16).blocks(b) for b in bodies]
    try:
        async with httpx.AsyncClient() as client:
            r = await client.post(h.url + "/v1/chat/completions", json=bodies[0])
            assert r.status_code == 200  # its events went to no subscriber
            sub.bind()
            task = asyncio.create_task(sub.run())
            await asyncio.sleep(0.3)  # the PUB socket reconnects to the bound SUB socket
            r = await client.post(h.url + "/v1/chat/completions", json=bodies[1])
            assert r.status_code == 200
        for _ in range(100):
            if all(index.holds(h.url, x) for bs in blocks for x in bs):
                break
            await asyncio.sleep(0.05)
        assert len(blocks[0]) >= 12
        assert [sum(index.holds(h.url, x) for x in bs) for bs in blocks] == [
            len(bs) for bs in blocks
        ]
        assert index.last_seq(h.url) is not None and sub.decode_errors == 0
    finally:
        if task is not None:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await stop_all([h])
        ctx.destroy(linger=0)


async def test_kv_aware_without_session_ids_keeps_conversations_on_their_cache() -> None:
    # replica i publishes on the configured port + i (vLLM's data-parallel offset), so the
    # three share one base endpoint and the router binds base + i for worker i
    base = free_port_block(3)
    kv = _kv(f"tcp://127.0.0.1:{base}")
    endpoints = [offset_endpoint_port(f"tcp://127.0.0.1:{base}", i) for i in range(3)]
    handles = []
    try:
        for i in range(3):
            handles.append(await start_emulator(dataclasses.replace(FAST, kv_events=kv), index=i))
        settings = RouterSettings.build(
            port=0,
            worker_urls=tuple(h.url for h in handles),
            policy="kv_aware",
            kv_events=tuple(f"{h.url}={ep}" for h, ep in zip(handles, endpoints, strict=True)),
            kv_tokenizer="emulator",
            kv_block_size=16,
            expose_worker_header=True,
            health_check_interval_secs=3600.0,
            shutdown_timeout_secs=1.0,
        )
        router = await start_router(settings)
        try:
            await asyncio.sleep(0.3)  # let the publishers connect
            workers: dict[str, list[str]] = {}
            cached: list[int] = []
            async with httpx.AsyncClient(timeout=10.0) as client:
                # a new conversation matches no worker, so its first turn goes by rendezvous hash
                # of its first block on the workers' URLs (random ports): with 12 conversations,
                # all on one of 3 workers happens with chance 3 ** -11 (6 gave 1 in 243, and did)
                for conv in range(12):
                    msgs: list[Any] = [
                        {"role": "system", "content": words(300, f"c{conv}-")},
                        user("go"),
                    ]
                    for turn in range(3):
                        r = await client.post(
                            router.url + "/v1/chat/completions",
                            json={"model": MODEL, "messages": msgs, "max_tokens": 20},
                        )
                        assert r.status_code == 200
                        workers.setdefault(str(conv), []).append(r.headers["x-sessionroute-worker"])
                        data = r.json()
                        if turn:
                            cached.append(data["usage"]["prompt_tokens_details"]["cached_tokens"])
                        msgs += [data["choices"][0]["message"], user(words(30, f"{conv}t{turn}"))]
                        await asyncio.sleep(0.05)  # the events reach the router
            for name, ws in workers.items():
                assert len(set(ws)) == 1, (name, ws)  # every turn back on its cache, no ids
            served = {ws[0] for ws in workers.values()}
            assert len(served) >= 2  # and spread
            assert min(cached) >= 300
            index = router.router.core.policy.index  # type: ignore[attr-defined]
            assert all(index.size(w) > 0 for w in served)  # each replica's events reached it
        finally:
            await router.stop()
    finally:
        await stop_all(handles)
