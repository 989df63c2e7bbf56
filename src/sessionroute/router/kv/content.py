"""A request body -> its vLLM block hashes (``RouteRequest.blocks`` for ``kv_aware`` live).

:class:`KvContent` joins the servers' tokenizer (:class:`~.tokenize.RequestEncoder`) and hash
scheme, hashed incrementally (:class:`~.prefixmemo.PrefixMemo`: a conversation's next turn
hashes only its new blocks); ``serve --kv-tokenizer DIR`` builds one and the router's
:class:`~sessionroute.router.requests.RequestBuilder` uses it instead of the text keys.
"""

from __future__ import annotations

from typing import Any, Protocol

from sessionroute.router.kv.emutokens import EMULATOR_TOKENIZER, EmulatorEncoder
from sessionroute.router.kv.prefixmemo import PrefixMemo, pack_token_ids
from sessionroute.router.kv.tokenize import RequestEncoder, load_encoder

__all__ = ["KvContent", "TokenEncoder", "load_kv_content"]


class TokenEncoder(Protocol):
    """A request body -> the prompt's token ids as the servers compute them."""

    def token_ids(self, payload: Any) -> list[int] | None:
        """The token ids, or None when the body has no prompt the encoder understands."""
        ...


class KvContent:
    """Block hashes of request bodies as the servers compute them.

    Args:
        encoder: the servers' tokenizer and chat template.
        memo: the servers' block size and hash scheme, with the memo of earlier prompts.
    """

    def __init__(self, encoder: TokenEncoder | RequestEncoder, memo: PrefixMemo) -> None:
        self.encoder = encoder
        self.memo = memo

    def blocks(self, payload: Any) -> list[int]:
        """The body's block hashes (empty when it has no prompt the encoder understands);
        the body's ``cache_salt`` is hashed in as vLLM does."""
        ids = self.encoder.token_ids(payload)
        if not ids:
            return []
        salt = payload.get("cache_salt") if isinstance(payload, dict) else None
        return self.memo.hashes(
            pack_token_ids(ids), salt if isinstance(salt, str) and salt else None
        )


def load_kv_content(
    model_dir: str, block_size: int, algo: str = "sha256", seed: str | None = None
) -> KvContent:
    """A :class:`KvContent` from a local model directory (or ``"emulator"``: the emulator's
    tokenizer, :mod:`~sessionroute.router.kv.emutokens`) and the servers' settings.

    Raises:
        ConfigError: unreadable tokenizer, bad block size, algo or seed.
    """
    if model_dir == EMULATOR_TOKENIZER:
        return KvContent(EmulatorEncoder(), PrefixMemo(block_size, algo, seed))
    return KvContent(load_encoder(model_dir), PrefixMemo(block_size, algo, seed))
