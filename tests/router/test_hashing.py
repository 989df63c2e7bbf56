"""fbi_hash / furc test vectors from shared/ROUTER.md (vllm-router parity)."""

from __future__ import annotations

import pytest

from sessionroute.router.policies.hashing import fbi_hash, furc, murmur64a


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
