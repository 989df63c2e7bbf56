"""Server-sent events of a streamed completion in vLLM's chunk shapes, encoded cheaply.

A streamed reply is one event per token; the JSON around each token is the same for the whole
request, so it is serialized once and each token's event is a concatenation (several times
faster than ``json.dumps`` of a dict per token, which dominated the emulator's CPU profile under
load).

Chat chunks: ``{"id", "object": "chat.completion.chunk", "created", "model", "choices":
[{"index": 0, "delta": {"content": piece}, "logprobs": null, "finish_reason": null |
"length"}]}``, preceded by a ``delta: {"role": "assistant", "content": ""}`` chunk. Completion
chunks: ``"object": "text_completion"`` and ``{"index": 0, "text": piece, "stop_reason": null,
"logprobs": null, "finish_reason": ...}``. With ``continuous_usage_stats`` every chunk carries
``usage`` (prompt, completion and total tokens so far).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "ChunkEncoder", "sse"]

DONE = b"data: [DONE]\n\n"
"""The last event of every stream."""


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sse(obj: Any) -> bytes:
    """One ``data:`` event holding ``obj`` as compact JSON."""
    return b"data: " + _dumps(obj) + b"\n\n"


class ChunkEncoder:
    """Events of one streamed request.

    Args:
        request_id: the response id.
        model: the served model name.
        created: Unix seconds.
        chat: chat chunks (else completion chunks).
        prompt_len: prompt tokens (for ``continuous_usage_stats``).
        continuous: put ``usage`` on every chunk.
    """

    __slots__ = ("_chat", "_continuous", "_head", "_mid", "_prompt_len", "head")

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        *,
        chat: bool,
        prompt_len: int,
        continuous: bool,
    ) -> None:
        self.head: dict[str, Any] = {
            "id": request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }
        self._chat = chat
        self._prompt_len = prompt_len
        self._continuous = continuous
        self._head = b"data: " + _dumps(self.head)[:-1] + b',"choices":[{"index":0,'
        self._mid = b'"delta":{"content":' if chat else b'"text":'

    def _tail(self, done_tokens: int) -> bytes:
        if not self._continuous:
            return b"}\n\n"
        p = self._prompt_len
        usage = {"prompt_tokens": p, "total_tokens": p + done_tokens}
        usage["completion_tokens"] = done_tokens
        return b',"usage":' + _dumps(usage) + b"}\n\n"

    def role(self) -> bytes:
        """The chat stream's first event (the assistant role, empty content)."""
        return (
            self._head
            + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            + self._tail(0)
        )

    def token(self, piece: str, index: int, last: bool) -> bytes:
        """The event of output token ``index`` (0-based); ``last`` sets ``finish_reason``."""
        close = b"}," if self._chat else b',"stop_reason":null,'
        finish = b'"length"' if last else b"null"
        return (
            self._head
            + self._mid
            + _dumps(piece)
            + close
            + b'"logprobs":null,"finish_reason":'
            + finish
            + b"}]"
            + self._tail(index + 1)
        )

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The ``include_usage`` event: no choices, the final usage."""
        return sse({**self.head, "choices": [], "usage": usage})
