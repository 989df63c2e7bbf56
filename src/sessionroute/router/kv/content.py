"""A request body -> its vLLM block hashes (``RouteRequest.blocks`` for ``kv_aware`` live).

:class:`KvContent` joins the servers' tokenizer (:class:`~.tokenize.RequestEncoder`) and hash
scheme (:class:`~.hashing.BlockHasher`); ``serve --kv-tokenizer DIR`` builds one and the
router's :class:`~sessionroute.router.requests.RequestBuilder` uses it instead of the text keys.
"""

from __future__ import annotations

from typing import Any

from sessionroute.router.kv.hashing import BlockHasher
from sessionroute.router.kv.tokenize import RequestEncoder, load_encoder

__all__ = ["KvContent", "load_kv_content"]


class KvContent:
    """Block hashes of request bodies as the servers compute them.

    Args:
        encoder: the servers' tokenizer and chat template.
        hasher: the servers' block size and hash scheme.
    """

    def __init__(self, encoder: RequestEncoder, hasher: BlockHasher) -> None:
        self.encoder = encoder
        self.hasher = hasher

    def blocks(self, payload: Any) -> list[int]:
        """The body's block hashes (empty when it has no prompt the encoder understands);
        the body's ``cache_salt`` is hashed in as vLLM does."""
        ids = self.encoder.token_ids(payload)
        if not ids:
            return []
        salt = payload.get("cache_salt") if isinstance(payload, dict) else None
        return self.hasher.hashes(ids, salt if isinstance(salt, str) and salt else None)


def load_kv_content(
    model_dir: str, block_size: int, algo: str = "sha256", seed: str | None = None
) -> KvContent:
    """A :class:`KvContent` from a local model directory and the servers' settings.

    Raises:
        ConfigError: unreadable tokenizer, bad block size, algo or seed.
    """
    return KvContent(load_encoder(model_dir), BlockHasher(block_size, algo, seed))
