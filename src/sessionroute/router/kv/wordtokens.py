"""Deterministic text <-> token ids for the emulator (``sessionroute emulate``; also the router's
``--kv-tokenizer emulator``): a word-level hashing tokenizer, a chat
template and generated filler text that round-trips through the tokenizer.

Text is split into *pieces* by one regular expression, in order of preference:

- a special marker ``<|name|>`` (``name``: 1-32 of ``[A-Za-z0-9_.-]``), e.g. ``<|user|>``;
- a word: an optional single leading space and a run of characters that are neither whitespace
  nor ``<`` (``" hello,"``), like GPT-style BPE pieces;
- a lone ``<``;
- a single whitespace character.

A piece's token id is the CRC-32 (``zlib.crc32``, the IEEE 802.3 polynomial) of its UTF-8 bytes,
in ``[0, 2**32)`` -- stable across processes, platforms and Python versions, unlike
``hash(str)``, and about ten times cheaper than BLAKE2b per piece, which matters for 100k-token
prompts of distinct words. The split is prefix-stable at the seams the
emulator creates: ``encode(a + b) == encode(a) + encode(b)`` whenever ``b`` starts with a special
marker, a whitespace character or a space-led word and ``a`` does not end inside a special
marker, so a multi-turn conversation's prompt extends the previous prompt plus its output token
for token, and shares the previous turn's KV blocks as in vLLM.

Generated text is a sequence of space-led four-letter words (``" bada kofe ..."``), one piece per
token, drawn from 256 words by BLAKE2b of a seed: tokenizing the returned text reproduces the
generated ids, and because every generated piece starts with a space it never merges with the
prompt's last piece.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = [
    "FILLER_WORDS",
    "ChatEncoder",
    "HashTokenizer",
    "filler_pieces",
    "render_chat",
]

_PIECE = re.compile(r" ?[^\s<]+|<\|[A-Za-z0-9_.\-]{1,32}\|>|<|\s")

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70 syllables

FILLER_WORDS: tuple[str, ...] = tuple(
    _SYLLABLES[b % 70] + _SYLLABLES[17 * (b // 70)] for b in range(256)
)
"""The 256 distinct words of generated text; byte ``b`` of the seed stream picks word ``b``."""


class HashTokenizer:
    """Word-level hashing tokenizer (see the module docstring for the split and the ids).

    Stateless: ids are computed, not looked up (CRC-32 of a short string costs about as much as
    a dictionary lookup), so instances are interchangeable and safe to share across threads.
    """

    __slots__ = ()

    @staticmethod
    def pieces(text: str) -> list[str]:
        """Split ``text`` into pieces; ``"".join(pieces(text)) == text``."""
        return _PIECE.findall(text)

    @staticmethod
    def token_id(piece: str) -> int:
        """The id of one piece: ``zlib.crc32`` of its UTF-8 bytes, in ``[0, 2**32)``."""
        return zlib.crc32(piece.encode("utf-8", "surrogatepass"))

    @staticmethod
    def ids(pieces: Iterable[str]) -> list[int]:
        """Token ids of already split pieces."""
        crc = zlib.crc32
        return [crc(p.encode("utf-8", "surrogatepass")) for p in pieces]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (one per piece)."""
        return self.ids(_PIECE.findall(text))


def render_chat(messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render chat messages into one prompt string.

    Each message becomes ``<|role|>\\n{content}<|end|>\\n``; with ``add_generation_prompt`` the
    text ends with ``<|assistant|>\\n``. So turn ``k + 1``'s prompt (turn ``k``'s messages, the
    assistant reply, a new user message) starts with turn ``k``'s prompt followed by the reply.

    Args:
        messages: ``(role, content)`` pairs.
        add_generation_prompt: append the assistant marker (vLLM's default for chat).

    Returns:
        The prompt text.
    """
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


class ChatEncoder:
    """Token ids of rendered chat messages, with a per-message memo.

    Every rendered message starts with ``<`` and ends with ``<|end|>\n``, so tokenization never
    crosses a message boundary: ``encode(render_chat(msgs))`` is the concatenation of each
    message's ids (plus the generation prompt's). A multi-turn conversation resends its history
    every turn; with the memo only the new messages are tokenized (a 100k-token history costs
    ~0.15 s to tokenize from scratch, ~2 ms from the memo).

    Args:
        tokenizer: the tokenizer (a fresh :class:`HashTokenizer` by default).
        max_tokens: memo size bound in tokens (least recently used messages go first), >= 0.
    """

    def __init__(self, tokenizer: HashTokenizer | None = None, max_tokens: int = 4_000_000) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else HashTokenizer()
        self.max_tokens = max_tokens
        self._memo: OrderedDict[tuple[str, str], array[int]] = OrderedDict()
        self._size = 0

    @property
    def memo_tokens(self) -> int:
        """Tokens held by the memo (<= ``max_tokens``)."""
        return self._size

    def _message(self, role: str, content: str) -> array[int]:
        key = (role, content)
        ids = self._memo.get(key)
        if ids is not None:
            self._memo.move_to_end(key)
            return ids
        ids = array("I", self.tokenizer.encode(f"<|{role}|>\n{content}<|end|>\n"))
        if len(ids) <= self.max_tokens:
            self._memo[key] = ids
            self._size += len(ids)
            while self._size > self.max_tokens:
                _, old = self._memo.popitem(last=False)
                self._size -= len(old)
        return ids

    def encode(
        self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """``tokenizer.encode(render_chat(messages, add_generation_prompt=...))``, memoized."""
        out: list[int] = []
        for role, content in messages:
            out.extend(self._message(role, content))
        if add_generation_prompt:
            out.extend(self.tokenizer.encode("<|assistant|>\n"))
        return out


def filler_pieces(seed: bytes, n: int) -> list[str]:
    """``n`` pieces of deterministic generated text, each a space-led word from
    :data:`FILLER_WORDS`.

    Word ``i`` is byte ``i % 64`` of ``blake2b(seed + (i // 64).to_bytes(8))`` (64-byte
    digests), so the same seed always gives the same text and a longer output extends a shorter
    one.

    Args:
        seed: any bytes (the emulator derives it from the prompt and the sampling nonce).
        n: pieces wanted, >= 0.

    Returns:
        ``n`` strings; ``"".join`` of them is the generated text.

    Raises:
        ValueError: if ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"filler length must be >= 0, got {n}")
    words = _SPACED
    out: list[str] = []
    chunk = 0
    while len(out) < n:
        digest = hashlib.blake2b(seed + chunk.to_bytes(8, "big"), digest_size=64).digest()
        out.extend(words[b] for b in digest[: n - len(out)])
        chunk += 1
    return out


_SPACED: tuple[str, ...] = tuple(" " + w for w in FILLER_WORDS)
