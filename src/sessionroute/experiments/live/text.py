"""Prompt text for live turns: the simulator's content identity rendered as chat messages.

A workload's :class:`~sessionroute.workloads.base.Turn` carries lengths (tokens) and the chained
keys of its KV blocks, not text. A live run needs text whose *sharing* is the same: two prompts
must share a prefix exactly where their blocks share keys. :class:`SessionText` builds a
session's chat history turn by turn:

- content token ``j`` of a prompt (simulator token coordinates) is a word chosen by BLAKE2b of
  the key of block ``j // block_size`` and the offset ``j % block_size``; tokens in the last,
  partial block (no key yet) take words chosen by the session id instead. Identical keys give
  identical words, distinct keys distinct words (up to 1 in 256 per word, and a whole block
  of equal words by chance is negligible), so shared system prompts and GRPO task statements are
  shared text, and private content is private;
- turn 1 is one user message; turn ``k + 1`` appends the assistant reply *as the server returned
  it* and one user message holding the new content (the simulator's
  ``prompt_len[k+1] - prompt_len[k] - output_len[k]`` tokens), so every prompt extends the
  previous prompt and its output, as in the simulator and in real multi-turn clients;
- the chat template's own tokens (measured once per run with ``POST /tokenize``, see
  :class:`TemplateOverhead`) are subtracted from the words, so the server sees about
  ``turn.prompt_len`` prompt tokens.

Words are the 256 space-separated four-letter :data:`WORDS` (consonant-vowel syllable pairs):
one token each in the emulator's word-level tokenizer, and single tokens of the tiny model's
byte-level BPE tokenizer too, which is trained on them
(:mod:`sessionroute.experiments.live.tiny_model`).
Pure and stdlib-only (the tiny-model builder imports it under vLLM's interpreter).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["WORDS", "SessionText", "TemplateOverhead", "content_words"]

_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")  # 70

WORDS: tuple[str, ...] = tuple(
    _SYLLABLES[b % 70] + _SYLLABLES[17 * (b // 70) + b % 7] for b in range(256)
)
"""256 distinct four-letter words; byte ``b`` of a BLAKE2b digest picks word ``b``."""


def _digest(seed: bytes, chunk: int) -> bytes:
    return hashlib.blake2b(seed + chunk.to_bytes(4, "big"), digest_size=64).digest()


def content_words(
    block_keys: Sequence[int], block_size: int, start: int, end: int, tail_seed: bytes
) -> list[str]:
    """The words of content tokens ``[start, end)`` of a prompt.

    Args:
        block_keys: the turn's chained block keys (``Turn.block_keys``).
        block_size: tokens per block of those keys (the host's ``block_size``).
        start, end: token range, simulator coordinates (``0 <= start``).
        tail_seed: seed of tokens in blocks without a key (e.g. the session id's bytes).

    Returns:
        ``max(0, end - start)`` words.
    """
    out: list[str] = []
    j = max(0, start)
    n_keys = len(block_keys)
    while j < end:
        b, off = divmod(j, block_size)
        stop = min(end, (b + 1) * block_size)
        if b < n_keys:
            seed = b"k" + (block_keys[b] & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
        else:
            seed = b"t" + tail_seed + b.to_bytes(8, "little")
        while j < stop:
            chunk, pos = divmod(off, 64)
            digest = _digest(seed, chunk)
            take = min(stop - j, 64 - pos)
            out.extend(WORDS[x] for x in digest[pos : pos + take])
            j += take
            off += take
    return out


@dataclass(frozen=True, slots=True)
class TemplateOverhead:
    """Prompt tokens the chat template adds (measured with the server's ``POST /tokenize``).

    Attributes:
        first: tokens of a one-message conversation beyond its content (emulator: 6 --
            ``<|user|>``, ``\\n``, ``<|end|>``, ``\\n``, ``<|assistant|>``, ``\\n``).
        per_turn: tokens a later turn adds beyond the reply and the new content (emulator: 8).
    """

    first: int = 0
    per_turn: int = 0


class SessionText:
    """One session's chat history (see the module docstring).

    Args:
        session_id: the session id (seeds the words of key-less tail blocks).
        block_size: tokens per block of the turns' keys.
        overhead: the chat template's tokens, subtracted from the content words.
    """

    __slots__ = ("_overhead", "_pending", "_prev_end", "block_size", "messages", "seed")

    def __init__(
        self, session_id: str, block_size: int, overhead: TemplateOverhead | None = None
    ) -> None:
        self.block_size = block_size
        self.seed = hashlib.blake2b(session_id.encode("utf-8"), digest_size=16).digest()
        self._overhead = overhead if overhead is not None else TemplateOverhead()
        self.messages: list[dict[str, Any]] = []
        self._prev_end = -1  # simulator tokens covered by the history (prompt + output), -1: none
        self._pending = False  # a turn was sent and its reply not yet added

    def next_messages(self, prompt_len: int, block_keys: Sequence[int]) -> list[dict[str, Any]]:
        """The messages of the next turn (the history plus one new user message).

        A prompt shorter than the history (the workload started over) restarts the history.

        Args:
            prompt_len: the turn's prompt tokens (simulator coordinates).
            block_keys: the turn's block keys.
        """
        if self._pending:
            self.add_reply("")
        if self._prev_end < 0 or prompt_len < self._prev_end:
            self.messages = []
            start = 0
            n = max(1, prompt_len - self._overhead.first)
        else:
            start = self._prev_end
            n = max(1, prompt_len - start - self._overhead.per_turn)
        words = content_words(block_keys, self.block_size, start, start + n, self.seed)
        self.messages.append({"role": "user", "content": " ".join(words)})
        self._prev_end = prompt_len
        self._pending = True
        return list(self.messages)

    def add_reply(self, text: str, output_len: int = 0) -> None:
        """Append the assistant's reply (as returned) to the history.

        Args:
            text: the reply text ("" when the turn failed).
            output_len: the turn's output tokens (simulator coordinates).
        """
        self.messages.append({"role": "assistant", "content": text})
        self._prev_end += output_len
        self._pending = False
