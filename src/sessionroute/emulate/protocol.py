"""Request bodies of the emulator's OpenAI endpoints (pydantic) and vLLM-shaped errors.

Only what the emulator uses is typed; every other field is accepted and ignored
(``extra="allow"``), as vLLM does for fields it does not know. Error bodies follow vLLM's
``ErrorResponse`` (``vllm/entrypoints/openai/protocol.py``)::

    {"error": {"message": str, "type": "BadRequestError" | "NotFoundError" | ..., "param": str |
     None, "code": <HTTP status>}}
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionroute.errors import SessionRouteError

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "EmulatorRequestError",
    "StreamOptions",
    "TokenizeRequest",
    "error_body",
    "message_text",
    "parse_body",
]

_ERROR_TYPES: dict[int, str] = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "RequestEntityTooLarge",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class EmulatorRequestError(SessionRouteError, ValueError):
    """A request the emulator refuses, with the HTTP status vLLM would answer.

    Attributes:
        status: HTTP status (400 bad request, 404 unknown model, 503 shutting down).
        param: the offending field, if one.
    """

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body for ``status``."""
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Base):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage``;
    ``continuous_usage_stats`` puts ``usage`` on every chunk."""

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ContentPart(_Base):
    """One part of a list ``content``; only ``text`` parts contribute to the prompt."""

    type: str
    text: str | None = None


class ChatMessage(_Base):
    """One chat message (``role`` and ``content``; ``tool_calls`` are rendered as JSON)."""

    role: str = Field(min_length=1)
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _Sampling(_Base):
    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = True
    temperature: float | None = None
    seed: int | None = None
    n: int = 1
    cache_salt: str | None = None


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is a string or token ids (one prompt only)."""

    prompt: str | list[int] | list[str] | list[list[int]]


class TokenizeRequest(_Base):
    """``POST /tokenize``: either ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


def message_text(message: ChatMessage) -> str:
    """The text a message contributes: its string content, or its text parts joined by
    ``"\\n"`` (vLLM's chat utils), followed by its ``tool_calls`` as compact sorted JSON."""
    content = message.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "\n".join(p.text for p in content if p.type == "text" and p.text is not None)
    if message.tool_calls:
        text += json.dumps(message.tool_calls, sort_keys=True, separators=(",", ":"))
    return text


def _loc(err: Any) -> str:
    return ".".join(str(p) for p in err["loc"])


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: Any) -> M:
    """Validate a decoded JSON body.

    Raises:
        EmulatorRequestError: 400 naming every invalid field (vLLM answers request validation
            errors with 400, not FastAPI's 422).
    """
    if not isinstance(body, dict):
        raise EmulatorRequestError(400, f"request body must be a JSON object, got {body!r:.80}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        parts = [f"{_loc(e)}: {e['msg']}" for e in errors]
        param = _loc(errors[0]) if errors else None
        raise EmulatorRequestError(400, "; ".join(parts), param) from None
