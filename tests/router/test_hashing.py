"""fbi_hash / furc test vectors from shared/ROUTER.md (vllm-router parity); CPython's int and
tuple hashes restated on 64-bit ints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.router import hashing
from sessionroute.router.hashing import (
    fbi_hash,
    furc,
    int_hash,
    murmur64a,
    tuple_hash3,
    tuple_hash_ints,
)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("", 0xC0663E029346E424),
        ("abc", 0xCA00380DC6CD9F55),
        ("header:x-session-id:sess-0", 0x83BF00F9D6E84E1E),
        ("request:", 0x13B2F1AE12A8B5AB),
        ("http://127.0.0.1:18001:0", 0xEEDA223B7FFFA085),
        ("sess-0:http://127.0.0.1:18002", 0x59368FFC0C4B2E42),
    ],
)
def test_fbi_hash_vectors(key: str, expected: int) -> None:
    assert fbi_hash(key) == expected


def test_furc_vector() -> None:
    assert furc("abc") == 6730815


def test_furc_range_and_bad_m() -> None:
    for i in range(200):
        assert 0 <= furc(f"k{i}", 7) < 7
    assert furc("anything", 1) == 0
    with pytest.raises(ValueError, match="m >= 1"):
        furc("x", 0)


def test_murmur_depends_on_every_byte() -> None:
    base = murmur64a(b"abcdefghij")
    assert murmur64a(b"abcdefghiJ") != base
    assert murmur64a(b"Abcdefghij") != base
    assert 0 <= base < 2**64


_EDGES = [0, 1, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, -(2**61 - 1), -(2**61), 2**63 - 1, -(2**63)]
i64s = st.one_of(st.sampled_from(_EDGES), st.integers(-(2**63), 2**63 - 1))


@given(a=i64s, b=i64s, c=i64s, rest=st.lists(i64s, max_size=9))
def test_int_and_tuple_hashes_equal_python_hash(a: int, b: int, c: int, rest: list[int]) -> None:
    # the arithmetic itself (_tuple_hash3 is what tuple_hash3 runs when compiled) and the
    # public functions, over the whole signed 64-bit range and the modulus's edges
    assert int_hash(a) == hash(a)
    assert hashing._tuple_hash3(a, b, c) == tuple_hash3(a, b, c) == hash((a, b, c))
    assert tuple_hash_ints(a, rest) == hash((a, *rest))
    assert tuple_hash_ints(a, [b, c]) == hash((a, b, c))


def test_int_hash_edges() -> None:
    # -1 is CPython's error value: hash(-1) is -2; -2**63 has no positive counterpart in 64 bits
    assert int_hash(-1) == -2
    assert int_hash(-(2**63)) == hash(-(2**63)) == -4
    assert all(-(2**63) <= tuple_hash3(i, -i, i * 7) < 2**63 for i in range(-50, 50))
