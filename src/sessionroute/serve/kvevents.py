"""ZMQ subscribers that feed the router's KV index from the workers' vLLM KV cache events.

One :class:`KvEventSubscriber` per worker: a SUB socket *bound* at the worker's endpoint (vLLM's
publisher connects its PUB socket to an endpoint without ``*``: start the server with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://ROUTER_HOST:PORT"}'``), decoding each ``[topic, seq, payload]`` message
(:mod:`sessionroute.router.kv.events`) into the policy's :class:`~sessionroute.router.kv.KvIndex`.

Sequence numbers (``vllm/distributed/kv_events.py``: one per batch, from 0):

* the next number: applied;
* a jump ahead (batches lost, e.g. past the socket's high-water mark): a **gap**. With a replay
  endpoint (the server's ``"replay_endpoint"``, a ROUTER socket it binds), the missed batches
  are fetched from it (a DEALER sends the first missing ``seq``; the server answers with its
  buffered batches from there, then ``seq = -1``; each reply is ``["", seq, payload]`` from
  older vLLM and SGLang, ``["", topic, seq, payload]`` from vLLM 0.32 and the emulator, and
  both are read) and applied in order; without one, or when the
  replay does not cover the gap within ``replay_timeout_s``, the worker's set is cleared and
  relearned from the events that follow (vLLM re-announces reused blocks as ``BlockStored``);
* ``seq == 0`` after later numbers (not a repeated 0): the publisher restarted (its engine's
  cache is new): clear and start over; other numbers not after the last: duplicates, ignored;
* the first batch seen with ``seq > 0`` (the router started after the server): with a replay
  endpoint, the earlier batches still buffered are replayed first.

A payload that does not decode is counted and dropped (the stream goes on; the next batch then
shows as a gap). Nothing here can stop the router: the loop logs and continues.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sessionroute.router.kv.events import (
    END_SEQ,
    MalformedEvent,
    decode_batch,
    decode_seq,
    encode_seq,
)
from sessionroute.router.kv.index import Applied, KvIndex
from sessionroute.serve.kvstreams import KvStreamConfig

__all__ = ["KvEventSubscriber", "KvEventsCollector"]

log = logging.getLogger("sessionroute.serve.kv")


class KvEventSubscriber:
    """Feeds ``index`` from one worker's event stream (module docstring).

    Args:
        stream: the worker and its endpoints.
        index: the index to feed.
        context: the ZMQ asyncio context (shared by the router's subscribers).
        replay_timeout_s: seconds to wait for each replayed message before giving up and
            clearing instead.

    Attributes:
        decode_errors: payloads that could not be decoded.
        resyncs: gaps resolved by replay (``"replay"``) or by clearing (``"clear"``), and
            publisher restarts (``"restart"``).
    """

    def __init__(
        self,
        stream: KvStreamConfig,
        index: KvIndex,
        context: zmq.asyncio.Context,
        *,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.stream = stream
        self.index = index
        self.context = context
        self.replay_timeout_s = replay_timeout_s
        self.decode_errors = 0
        self.resyncs: dict[str, int] = {"replay": 0, "clear": 0, "restart": 0}
        self._sock: zmq.asyncio.Socket | None = None
        index.add_worker(stream.worker)

    def bind(self) -> None:
        """Bind the SUB socket (before :meth:`run`, so a bind error surfaces at start).

        Raises:
            zmq.ZMQError: the endpoint cannot be bound (in use, bad address).
        """
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.SUBSCRIBE, self.stream.topic.encode())
        try:
            sock.bind(self.stream.endpoint)
        except zmq.ZMQError:
            sock.close(0)
            raise
        self._sock = sock

    async def run(self) -> None:
        """Receive and apply batches until cancelled."""
        if self._sock is None:
            self.bind()
        sock = self._sock
        if sock is None:  # pragma: no cover - bind sets it or raises
            raise RuntimeError("KV event socket not bound")
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    await self.handle(frames)
                except asyncio.CancelledError:
                    raise
                except Exception:  # never let one bad message end the stream
                    log.exception("KV events from %s: message dropped", self.stream.worker)
        finally:
            sock.close(0)
            self._sock = None

    async def handle(self, frames: list[bytes]) -> None:
        """Apply one published message ``[topic, seq, payload]``."""
        worker = self.stream.worker
        if len(frames) != 3:
            self.decode_errors += 1
            log.warning("KV events from %s: %d frames, expected 3", worker, len(frames))
            return
        try:
            seq = decode_seq(frames[1])
            batch = decode_batch(frames[2])
        except MalformedEvent as exc:
            self.decode_errors += 1
            log.warning("KV events from %s: %s", worker, exc)
            return
        index = self.index
        last = index.last_seq(worker)
        if last is not None and seq <= last:
            if seq == 0 and last > 0:  # the publisher restarted: its engine's cache is new
                self.resyncs["restart"] += 1
                index.clear(worker)
                index.restart_stream(worker)
            else:
                return
        elif last is None and seq > 0 and self.stream.replay_endpoint is not None:
            await self._replay(0, seq)
        elif last is not None and seq > last + 1:
            index.stats[worker].gaps += 1
            if self.stream.replay_endpoint is not None:
                await self._replay(last + 1, seq)
            after = index.last_seq(worker)
            if after is None or after < seq - 1:
                self.resyncs["clear"] += 1
                index.clear(worker)
                index.restart_stream(worker)
            else:
                self.resyncs["replay"] += 1
        if index.apply(worker, seq, batch) is Applied.GAP:  # pragma: no cover - handled above
            log.warning("KV events from %s: unexpected gap at %d", worker, seq)

    async def _replay(self, start: int, until: int) -> None:
        """Apply the server's buffered batches ``start .. until - 1`` in order (best effort:
        stops at the end marker, a timeout or an undecodable message)."""
        endpoint = self.stream.replay_endpoint
        if endpoint is None:
            return
        worker = self.stream.worker
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", encode_seq(start)])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                # ["", seq, payload] (older vLLM, SGLang) or ["", topic, seq, payload] (vLLM
                # 0.32, the emulator): the seq and payload are the last two
                if len(frames) not in (3, 4) or frames[0]:
                    log.warning(
                        "KV replay from %s: %d frames, expected 3 or 4 after an empty delimiter",
                        worker,
                        len(frames),
                    )
                    return
                seq = decode_seq(frames[-2])
                if seq == END_SEQ:
                    return
                if seq >= until:
                    continue
                last = self.index.last_seq(worker)
                if last is not None and seq != last + 1 and seq > last:
                    return  # the server's buffer no longer holds what is missing
                self.index.apply(worker, seq, decode_batch(frames[-1]))
        except (TimeoutError, MalformedEvent, zmq.ZMQError) as exc:
            log.warning("KV replay from %s (%s) failed: %s", worker, endpoint, exc)
        finally:
            sock.close(0)


class KvEventsCollector(Collector):
    """Prometheus families of the KV index and its subscribers (prefixed ``sessionroute_``):
    ``kv_event_batches_total{worker}``, ``kv_blocks_stored_total{worker}``,
    ``kv_blocks_removed_total{worker}``, ``kv_cache_clears_total{worker}``,
    ``kv_event_gaps_total{worker}``, ``kv_resyncs_total{worker,how}``,
    ``kv_event_decode_errors_total{worker}``, ``kv_index_blocks{worker}``."""

    def __init__(self, index: KvIndex, subscribers: list[KvEventSubscriber]) -> None:
        self.index = index
        self.subscribers = subscribers

    def collect(self) -> Iterator[Metric]:
        index = self.index
        fams = {
            "batches": CounterMetricFamily(
                "sessionroute_kv_event_batches", "KV event batches applied", labels=["worker"]
            ),
            "stored": CounterMetricFamily(
                "sessionroute_kv_blocks_stored", "block hashes stored", labels=["worker"]
            ),
            "removed": CounterMetricFamily(
                "sessionroute_kv_blocks_removed", "block hashes removed", labels=["worker"]
            ),
            "cleared": CounterMetricFamily(
                "sessionroute_kv_cache_clears", "worker sets cleared", labels=["worker"]
            ),
            "gaps": CounterMetricFamily(
                "sessionroute_kv_event_gaps", "sequence gaps detected", labels=["worker"]
            ),
        }
        size = GaugeMetricFamily(
            "sessionroute_kv_index_blocks", "block hashes indexed", labels=["worker"]
        )
        for worker, st in list(index.stats.items()):
            for name, fam in fams.items():
                fam.add_metric([worker], float(getattr(st, name)))
            size.add_metric([worker], float(index.size(worker)))
        resyncs = CounterMetricFamily(
            "sessionroute_kv_resyncs", "gaps and restarts resolved", labels=["worker", "how"]
        )
        errors = CounterMetricFamily(
            "sessionroute_kv_event_decode_errors", "undecodable messages", labels=["worker"]
        )
        for sub in self.subscribers:
            for how, n in sub.resyncs.items():
                resyncs.add_metric([sub.stream.worker, how], float(n))
            errors.add_metric([sub.stream.worker], float(sub.decode_errors))
        yield from fams.values()
        yield size
        yield resyncs
        yield errors
