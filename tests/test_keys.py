"""Content keys (:mod:`sessionroute.keys`): splitmix64's finalizer and the chain built on it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.keys import GAMMA, MASK64, chain_key, mix64, offset_keys
from sessionroute.native import PURE_ENV


def test_mix64_gives_splitmix64s_published_outputs() -> None:
    # splitmix64 seeded with 0 returns mix64(k * GAMMA) for k = 1, 2, 3 (Vigna's splitmix64.c)
    outputs = [mix64(k * GAMMA) for k in (1, 2, 3)]
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_mix64_is_a_bijection_on_a_sample_and_stays_in_64_bits() -> None:
    inputs = [*range(5000), *(MASK64 - i for i in range(5000)), *(i << 40 for i in range(5000))]
    outputs = {mix64(x) for x in inputs}
    assert len(outputs) == len(set(inputs))
    assert all(0 <= y <= MASK64 for y in outputs)
    assert mix64(1 << 64) == mix64(0) == 0  # taken mod 2**64; zero is its fixed point


def test_chain_key_folds_each_item_in_order() -> None:
    h = 123
    for x in (7, 0, 4096):
        h = mix64((h ^ x) + GAMMA)
    assert chain_key(123, 7, 0, 4096) == h
    assert chain_key(123, 7, 4096, 0) != h  # order matters
    assert chain_key(123) == 123
    assert chain_key(0, 0) != 0  # GAMMA keeps zero from being a fixed point of the chain


def test_chain_key_is_an_explicit_value_not_a_python_hash() -> None:
    # pinned: the same on every platform and Python version, compiled or not
    assert chain_key(0, 1, 2) == 0xBCD9DBB49673066B


i64s = st.integers(-(2**63), 2**63 - 1)


@given(parent=i64s, items=st.lists(i64s, max_size=8))
def test_negative_ints_are_their_twos_complement(parent: int, items: list[int]) -> None:
    key = chain_key(parent, *items)
    assert 0 <= key <= MASK64
    assert key == chain_key(parent & MASK64, *(x & MASK64 for x in items))


@given(st.lists(st.tuples(i64s, i64s, i64s), min_size=2, max_size=50, unique=True))
def test_distinct_contents_get_distinct_keys(contents: list[tuple[int, int, int]]) -> None:
    assert len({chain_key(*c) for c in contents}) == len(contents)


def test_offset_keys_are_the_segment_key_plus_each_offset_mod_2_64() -> None:
    key = chain_key(0, 12345)
    assert offset_keys(key, 0, 64, 16) == [key + o for o in (0, 16, 32, 48)]
    assert offset_keys(key, 5, 37, 16) == [key + 5, key + 21]
    assert offset_keys(key, 0, 0, 16) == []
    near_top = MASK64 - 20
    assert offset_keys(near_top, 0, 64, 16) == [MASK64 - 20, MASK64 - 4, 11, 27]  # wraps


def test_a_block_chains_runs_differ_from_each_other_and_from_other_blocks() -> None:
    from sessionroute.keys import BlockChain

    keys: list[int] = []
    for seg in range(1, 200):  # 199 chains of 2 segments: 50 shared blocks, then their own
        chain = BlockChain(16)
        chain.append(0, 800)
        chain.append(seg, 16 * 40 + 7)
        keys += chain.keys if seg == 1 else chain.keys[50:]
    assert len(set(keys)) == len(keys) == 50 + 199 * 40


_KEYS = """
import random
import sessionroute.keys
from sessionroute.keys import BlockChain, chain_key, mix64, offset_keys
print("pure" if sessionroute.keys.__file__.endswith(".py") else "compiled")
rng = random.Random(7)
out = [mix64(rng.getrandbits(70) - 2**69) for _ in range(200)]
out += [chain_key(rng.getrandbits(64), *(rng.getrandbits(65) - 2**64 for _ in range(k)))
        for k in range(9)]
out += offset_keys(rng.getrandbits(64), 0, 300, 7) + offset_keys(2**64 - 100, 0, 300, 7)
for bs in (1, 16, 256):
    chain = BlockChain(bs)
    for seg in range(1, 40):
        chain.append(seg, rng.randrange(0, 700))
    out += chain.keys
print(len(out), sum(out) % (2**61 - 1), sum(i * k for i, k in enumerate(out)) % (2**61 - 1))
"""


def test_compiled_keys_equal_pure_python_keys() -> None:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    runs = []
    for pure in (True, False):
        done = subprocess.run(
            [sys.executable, "-c", _KEYS],
            env={**env, PURE_ENV: "1"} if pure else env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.split())
    (pure_build, *pure_keys), (build, *keys) = runs
    assert pure_build == "pure"
    if build != "compiled":
        pytest.skip("no compiled build here (installed with SESSIONROUTE_PURE_PYTHON=1?)")
    assert keys == pure_keys
    assert int(keys[0]) > 300
