"""KV event decoding edge cases and the index's bookkeeping and matching."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.errors import ConfigError
from sessionroute.router.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    MalformedEvent,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
    hash_key,
)
from sessionroute.router.kv.index import Applied, KvIndex


def _stored(*hashes: int) -> BlockStored:
    return BlockStored(tuple(hashes), None, tuple(range(2 * len(hashes))), 2, None, "GPU")


def test_array_form_of_older_vllm_decodes() -> None:
    raw = msgpack.packb(
        [1.5, [["BlockStored", [1, 2], None, [7, 8, 9, 10], 2, None, "GPU"],
               ["BlockRemoved", [1]], ["AllBlocksCleared"]], 3]
    )  # fmt: skip
    batch = decode_batch(raw)
    assert batch == KVEventBatch(
        1.5,
        (
            BlockStored((1, 2), None, (7, 8, 9, 10), 2, None, "GPU"),
            BlockRemoved((1,), None),
            AllBlocksCleared(),
        ),
        3,
    )


def test_bytes_hashes_become_vllms_int_form() -> None:
    h = bytes(range(32))
    assert hash_key(h) == int.from_bytes(h, "big") & (2**64 - 1)
    raw = msgpack.packb([0.0, [{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"}]])
    assert decode_batch(raw).events == (BlockRemoved((hash_key(h),), "GPU"),)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never used in msgpack
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0, [{"type": "BlockExploded"}]]),
        msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]),
        msgpack.packb([1.0, [["BlockStored", ["x"], None, [1], 1]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]),
        msgpack.packb([1.0, [7]]),
    ],
)
def test_malformed_payloads_raise(payload: bytes) -> None:
    with pytest.raises(MalformedEvent):
        decode_batch(payload)


def test_seq_frames() -> None:
    assert decode_seq(encode_seq(5)) == 5
    assert decode_seq(encode_seq(-1)) == -1
    with pytest.raises(MalformedEvent):
        decode_seq(b"\x00")


def test_apply_detects_gaps_and_stale_batches() -> None:
    index = KvIndex()
    b = KVEventBatch(0.0, (_stored(1),))
    assert index.apply("w", 3, b) is Applied.APPLIED  # joining mid-stream is no gap
    assert index.apply("w", 4, KVEventBatch(0.0, (_stored(2),))) is Applied.APPLIED
    assert index.apply("w", 4, b) is Applied.STALE
    assert index.apply("w", 7, KVEventBatch(0.0, (_stored(3),))) is Applied.GAP
    assert index.stats["w"].gaps == 1
    assert index.last_seq("w") == 7
    assert index.size("w") == 3
    index.restart_stream("w")
    assert index.apply("w", 0, KVEventBatch(0.0, (AllBlocksCleared(),))) is Applied.APPLIED
    assert index.size("w") == 0
    assert index.stats["w"].cleared == 1


def test_matching_is_per_worker_and_prefix_based() -> None:
    index = KvIndex()
    index.store("a", [10, 11, 12, 13])
    index.store("b", [10, 11])
    index.store("c", [99])
    index.add_worker("d")
    assert index.matched_blocks([10, 11, 12, 13, 14], ["a", "b", "c", "d", "e"]) == {
        "a": 4,
        "b": 2,
    }
    assert index.matched_blocks([10, 11, 12], ["b", "a"]) == {"b": 2, "a": 3}
    assert index.matched_blocks([10, 11, 12], ["b"]) == {"b": 2}  # only the workers asked
    assert index.matched_blocks([], ["a"]) == {}
    index.remove("a", [12, 13, 777])
    assert index.matched_blocks([10, 11, 12, 13], ["a"]) == {"a": 2}
    assert index.stats["a"].removed == 2
    workers = ("a", "b")
    assert index.matched_blocks([10, 11], workers) == {"a": 2, "b": 2}
    index.remove_worker("b")
    assert index.matched_blocks([10, 11], workers) == {"a": 2}  # same tuple: mask refreshed
    index.store("e", [10])  # takes b's freed slot: must not inherit b's blocks
    assert index.matched_blocks([10, 11], ["e"]) == {"e": 1}


def test_bound_forgets_the_oldest() -> None:
    index = KvIndex(max_blocks_per_worker=3)
    index.store("a", [1, 2, 3])
    index.store("a", [1])  # refreshed: now newest
    index.store("a", [4])
    assert index.size("a") == 3
    assert not index.holds("a", 2)
    assert index.holds("a", 1) and index.holds("a", 4)
    assert index.stats["a"].dropped == 1
    with pytest.raises(ConfigError):
        KvIndex(0)


def test_non_gpu_media_are_not_indexed() -> None:
    index = KvIndex()
    index.apply_events("a", [BlockStored((1,), None, (0, 0), 2, None, "CPU")])
    assert index.size("a") == 0


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.integers(0, 45),
)
def test_matching_equals_a_linear_walk_on_prefix_closed_sets(lengths: list[int], n: int) -> None:
    chain = list(range(1000, 1000 + n))
    index = KvIndex()
    workers = [f"w{i}" for i in range(len(lengths))]
    for w, k in zip(workers, lengths, strict=True):
        index.add_worker(w)
        index.store(w, range(1000, 1000 + k))
    expect = {w: min(k, n) for w, k in zip(workers, lengths, strict=True) if min(k, n)}
    assert index.matched_blocks(chain, workers) == expect


def test_round_trip_of_every_event_type() -> None:
    batch = KVEventBatch(2.0, (_stored(1, 2), BlockRemoved((2,), "GPU"), AllBlocksCleared()), 1)
    assert decode_batch(encode_batch(batch)) == batch
