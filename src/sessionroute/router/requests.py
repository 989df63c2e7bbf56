"""One builder of the policy's request, from an HTTP request or from a simulated turn.

Everything a policy learns about a request comes from :class:`RequestBuilder`, in the live
router and in the simulator alike:

* **session id**: the first configured session header whose value is non-empty after trailing
  blanks are stripped, decoded as UTF-8 (invalid bytes replaced, so the id always hashes);
  without one, the first configured body field holding a non-empty string
  (``session_params.session_id``, ``prompt_cache_key``, ``user`` by default;
  :mod:`sessionroute.router.session_keys`);
  the simulated client sends its rollout id in the first configured header, as
  :class:`sessionroute.client.Rollout` does;
* **size estimate**: :func:`estimate_prompt_tokens` of the request body's size in bytes; a
  simulated request's body is modelled as :data:`BYTES_PER_TOKEN` bytes per prompt token;
* **content** (only for policies with ``needs_content``): chained prefix keys, one per full
  block of ``RouterConfig.content_block_tokens`` tokens. Live, the prompt text's UTF-8 bytes
  are cut into blocks of ``content_block_tokens * BYTES_PER_TOKEN`` bytes and key ``i`` is the
  64-bit BLAKE2b digest of blocks ``0..i`` (:func:`text_block_keys`); simulated, key ``i`` is
  the workload's key of the last KV block inside content block ``i``
  (:func:`coarsen_block_keys`). Either way two requests share key ``i`` exactly when they
  share their first ``i + 1`` content blocks.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sessionroute.errors import MalformedRequest
from sessionroute.router.config import RouterConfig
from sessionroute.router.session_keys import BODY_PREFIX, body_session_id
from sessionroute.router.validate import check_session_id, parse_body
from sessionroute.types import RouteRequest

if TYPE_CHECKING:
    from sessionroute.router.kv.content import KvContent

__all__ = [
    "BYTES_PER_TOKEN",
    "SESSION_ID_CACHE",
    "RequestBuilder",
    "coarsen_block_keys",
    "estimate_prompt_tokens",
    "prompt_text",
    "text_block_keys",
]

BYTES_PER_TOKEN = 4
"""Bytes of request body per prompt token assumed by the size estimate (BPE tokenizers
average about 4 characters of English text per token; JSON overhead is counted too)."""


SESSION_ID_CACHE = 4096
"""Session header values whose checked, decoded id is kept (the oldest is dropped past it)."""

SESSION_ORIGINS = 65536
"""Session ids whose origin (header or body field) is kept for ``GET /sessions/{id}``."""


def estimate_prompt_tokens(body_bytes: int) -> int:
    """Prompt size estimate in tokens from a request body of ``body_bytes`` bytes."""
    return body_bytes // BYTES_PER_TOKEN


def prompt_text(payload: Any) -> str:
    """The prompt text of an OpenAI request body: message contents joined, or the prompt.

    Chat ``messages[*].content`` strings (or the ``text`` of content parts) are concatenated in
    order; otherwise ``prompt`` (a string or list of strings) or ``input`` is used. Returns ""
    when none is present.
    """
    if not isinstance(payload, dict):
        return ""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
        return "".join(parts)
    for key in ("prompt", "input"):
        value = payload.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return "".join(value)
    return ""


def text_block_keys(text: str, block_bytes: int, *, tail: bool = False) -> list[int]:
    """Chained prefix keys of ``text``: key ``i`` is the 8-byte BLAKE2b digest (little-endian
    int) of the first ``(i + 1) * block_bytes`` bytes of its UTF-8 encoding; full blocks only,
    unless ``tail``: then a last key, of the whole text, follows when the text ends inside a
    block (a prompt shorter than a block gets one key, and an identical prompt the same one).

    Raises:
        ValueError: if ``block_bytes < 1``.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    data = text.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(digest_size=8)
    keys: list[int] = []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h.update(data[start : start + block_bytes])
        keys.append(int.from_bytes(h.copy().digest(), "little"))
    if tail and len(data) % block_bytes:
        h.update(data[len(data) - len(data) % block_bytes :])
        keys.append(int.from_bytes(h.digest(), "little"))
    return keys


def coarsen_block_keys(
    keys: Sequence[int], prompt_tokens: int, kv_block_tokens: int, content_block_tokens: int
) -> Sequence[int]:
    """Content-block keys from chained KV-block keys (``keys[i]`` identifies KV blocks ``0..i``).

    Content block ``j`` covers tokens ``[0, (j + 1) * content_block_tokens)``; its key is the
    key of the last KV block that ends inside it. Blocks with no such KV block are skipped, and
    only full content blocks of the prompt count. With equal block sizes the keys of the
    prompt's full blocks are returned as they are (no copy when there is nothing to cut).
    """
    full = prompt_tokens // content_block_tokens
    if content_block_tokens == kv_block_tokens:
        return keys if len(keys) == full else keys[:full]
    if content_block_tokens < kv_block_tokens:
        # every KV block ending inside the prompt's full content blocks, once: a prefix
        n = full * content_block_tokens // kv_block_tokens
        return keys if len(keys) == n else keys[:n]
    if content_block_tokens % kv_block_tokens == 0:
        step = content_block_tokens // kv_block_tokens
        return keys[step - 1 : full * step : step]
    out: list[int] = []
    last = -1
    for j in range(1, full + 1):
        i = j * content_block_tokens // kv_block_tokens - 1
        if i > last and i < len(keys):
            out.append(keys[i])
            last = i
    return out


class RequestBuilder:
    """Builds the :class:`~sessionroute.types.RouteRequest` a policy sees (module docstring).

    Args:
        config: the router configuration (session headers, content block size).
        needs_content: whether the policy reads :attr:`RouteRequest.blocks`; without it the
            body is never parsed and ``blocks`` is None.
        kv_content: the servers' tokenizer and block-hash scheme; when given, a live
            request's ``blocks`` are its vLLM block hashes (:mod:`sessionroute.router.kv`)
            instead of text keys.
        content_tail: end a live request's text keys with the key of its last partial block
            (``cache_aware``, which matches finely on short prompts as vllm-router does).
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        needs_content: bool,
        kv_content: KvContent | None = None,
        content_tail: bool = False,
    ) -> None:
        self.config = config
        self.needs_content = needs_content
        self.content_tail = content_tail
        """A live request's text keys end with the key of its last partial block
        (:func:`text_block_keys` with ``tail``; the policy's ``content_tail``)."""
        self.kv_content = kv_content
        self.session_names: tuple[tuple[bytes, str], ...] = tuple(
            (n.encode("latin-1"), n) for n in config.session_headers
        )
        """(lower-case name as bytes, as text) of the session headers, in order."""
        self._block_bytes = config.content_block_tokens * BYTES_PER_TOKEN
        self._max_id = config.max_session_id_bytes
        # a session's turns all arrive with the same id: check and decode it once per session
        # (the newest SESSION_ID_CACHE ids; an id that fails the check raises, and is never
        # cached, nor is one of blanks only)
        self._session_ids: OrderedDict[bytes, str] = OrderedDict()
        self._body_fields: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
            (BODY_PREFIX + f, tuple(f.split("."))) for f in config.session_body_fields
        )
        """(origin label, path) of the body fields read for a session id, in order."""
        self.origins: OrderedDict[str, str] = OrderedDict()
        """Session id -> where it was last read from (a header's lower-case name, or
        ``body:<field>``), for the newest :data:`SESSION_ORIGINS` ids (``GET
        /sessions/{id}``); recorded when a header value is first seen and on every body id."""
        self._turn_session = functools.lru_cache(maxsize=4096)(self._session_of_turn)

    def session(self, headers: Mapping[bytes, bytes]) -> tuple[str, str] | None:
        """The session id and the (lower-case) header it came from, or None.

        Args:
            headers: request headers by lower-case name.

        Raises:
            MalformedRequest: the id is over ``max_session_id_bytes`` bytes or has a control
                character (:func:`~sessionroute.router.validate.check_session_id`).
        """
        for name, label in self.session_names:
            value = headers.get(name)
            if value:
                sid = self._session_ids.get(value) or self._checked_session_id(value, label)
                if sid is not None:
                    return sid, label
        return None

    def body_session(self, payload: Mapping[str, Any]) -> tuple[str, str] | None:
        """The session id from the body fields (``RouterConfig.session_body_fields``) and its
        origin label (``body:<field>``), or None (:mod:`sessionroute.router.session_keys`).

        Raises:
            MalformedRequest: the id is too long or has a control character.
        """
        found = body_session_id(payload, self._body_fields)
        if found is not None:
            check_session_id(found[0].encode("utf-8", "replace"), self._max_id)
            self._note_origin(*found)
        return found

    def _note_origin(self, sid: str, label: str) -> None:
        origins = self.origins
        origins[sid] = label
        if len(origins) > SESSION_ORIGINS:
            origins.popitem(last=False)

    def _checked_session_id(self, value: bytes, label: str = "") -> str | None:
        """A session header's value as the id (trailing blanks stripped, checked, decoded
        as UTF-8 with invalid bytes replaced), or None when only blanks are left; a valid id
        is cached."""
        stripped = value.rstrip(b" \t")
        if not stripped:
            return None
        check_session_id(stripped, self._max_id)
        sid = stripped.decode("utf-8", "replace")
        cache = self._session_ids
        if len(cache) >= SESSION_ID_CACHE:
            cache.popitem(last=False)
        cache[value] = sid
        if label:
            self._note_origin(sid, label)
        return sid

    def from_http(
        self,
        headers: Mapping[bytes, bytes],
        body: Sequence[bytes],
        body_bytes: int,
        request_id: str,
        route: str = "",
    ) -> RouteRequest:
        """The policy's view of an HTTP request, after the checks of
        :mod:`sessionroute.router.validate` (for every policy: nothing is placed unless they
        pass).

        Args:
            headers: request headers by lower-case name.
            body: the body as the pieces it arrived in.
            body_bytes: the body's size in bytes.
            request_id: the request's id.
            route: the request path, for the body's shape check.

        Raises:
            MalformedRequest: a bad session id, or a body that is not the route's JSON.
        """
        found = self.session(headers)
        encoding = headers.get(b"content-encoding")
        if encoding is None or encoding.strip().lower() in (b"", b"identity"):
            # (one piece is joined without a copy)
            payload = parse_body(b"".join(body), route)
        elif self.needs_content:
            raise MalformedRequest(
                "the policy reads the prompt and the body is compressed "
                f"(Content-Encoding: {encoding.decode('latin-1')})"
            )
        else:
            # a compressed body (gzip, ...) goes to the worker as received, unread: the
            # router does not inflate client bytes (a decompression bomb costs it nothing)
            payload = {}
        if found is None and self._body_fields:
            found = self.body_session(payload)
        sid, header = found if found is not None else (None, self.session_names[0][1])
        blocks: list[int] | None = None
        model: str | None = None
        salt: str | None = None
        if self.needs_content:
            if self.kv_content is not None:
                blocks = self.kv_content.blocks(payload)
            else:
                blocks = text_block_keys(
                    prompt_text(payload), self._block_bytes, tail=self.content_tail
                )
            m = payload.get("model")
            model = m if isinstance(m, str) else None
            s = payload.get("cache_salt")
            salt = s if isinstance(s, str) and s else None
        return RouteRequest(  # (the fields in order)
            sid,  # session_id
            estimate_prompt_tokens(body_bytes),  # prompt_tokens
            blocks,
            model,
            request_id,
            header,  # session_header
            payload.get("stream") is True,  # stream
            salt,  # cache_salt
        )

    def from_turn(
        self,
        session_id: str | None,
        prompt_tokens: int,
        block_keys: Sequence[int],
        kv_block_tokens: int,
        request_id: str,
        cache_salt: str | None = None,
    ) -> RouteRequest:
        """The policy's view of a simulated turn, as the live router would build it.

        Args:
            session_id: the id the simulated client sends in the first session header, or
                None when it sends none.
            prompt_tokens: the prompt's length in tokens (its body is modelled as
                :data:`BYTES_PER_TOKEN` bytes per token).
            block_keys: the prompt's chained KV-block keys (one per block of
                ``kv_block_tokens``).
            kv_block_tokens: tokens per KV block of ``block_keys``.
            request_id: the attempt's id.
            cache_salt: the turn's prefix-cache namespace (kept only for content policies).
        """
        sid, header = self._turn_session(session_id)
        blocks = (
            coarsen_block_keys(
                block_keys, prompt_tokens, kv_block_tokens, self.config.content_block_tokens
            )
            if self.needs_content
            else None
        )
        return RouteRequest(  # (the fields in order, as in from_http)
            sid,  # session_id
            estimate_prompt_tokens(prompt_tokens * BYTES_PER_TOKEN),  # prompt_tokens
            blocks,
            None,  # model
            request_id,
            header,  # session_header
            False,  # stream
            cache_salt if self.needs_content else None,  # cache_salt
        )

    def _session_of_turn(self, session_id: str | None) -> tuple[str | None, str]:
        """The session id and header a simulated turn's id arrives as: sent in the first
        session header, read back by :meth:`session` (the live rule)."""
        name, label = self.session_names[0]
        headers = {name: session_id.encode("utf-8", "surrogatepass")} if session_id else {}
        found = self.session(headers)
        return found if found is not None else (None, label)
