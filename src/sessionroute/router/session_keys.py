"""Session ids from the request body, and the hash keys ``consistent_hash`` places them by.

The router core reads a session id from, in order: the ``--session-headers`` (first non-empty
one wins), then the body fields of ``--session-body-fields`` (first non-empty string wins):

* ``session_params.session_id``: vllm-router's body session id (SGLang's ``session_params``);
* ``prompt_cache_key``: OpenAI's prompt-cache routing key (Chat Completions and Responses
  APIs, https://platform.openai.com/docs/guides/prompt-caching), what OpenAI SDK clients
  and Codex send to keep one conversation on one cache;
* ``user``: OpenAI's end-user id (every request of a user is then one session).

Measured against vllm-router 0.1.17's ``consistent_hash`` (40 ids each, three workers):
headers come first, a body ``session_params.session_id`` S is hashed as ``request:S``, and
``user`` and ``prompt_cache_key`` are not read (such requests are hashed by their text).
:func:`ring_key` reproduces this, and gives the two fields vllm-router does not read keys of
their own (``body:<field>:<id>``).

A field is a dotted path into the JSON body; only a non-empty string value is an id (a number
or object is ignored). Ids are checked as header ids are
(:func:`~sessionroute.router.validate.check_session_id`: length and control characters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessionroute.router.policies._ring import BODY_PREFIX, VLLM_ROUTER_BODY_FIELD, ring_key

__all__ = [
    "AGENT_SESSION_HEADERS",
    "BODY_PREFIX",
    "DEFAULT_SESSION_BODY_FIELDS",
    "VLLM_ROUTER_BODY_FIELD",
    "body_session_id",
    "ring_key",
]

AGENT_SESSION_HEADERS: tuple[str, ...] = (
    "x-claude-code-session-id",
    "session_id",
    "x-opencode-session",
)
"""Session headers of agent harnesses, all session-scoped (one value per conversation):

* ``x-claude-code-session-id``: Claude Code's. Not verified against Claude Code itself (closed
  source); vllm-router 0.1.17 reads it for program scheduling (the name is in its binary's
  strings, with ``x-claude-code-agent-id``, ``x-claude-code-parent-agent-id`` and
  ``thread-id``), and third-party proxies read it from Claude Code's requests.
* ``session_id``: Codex CLI's conversation id (``build_conversation_headers`` in
  ``codex-rs/codex-api/src/requests/headers.rs``, openai/codex).
* ``x-opencode-session``: OpenCode's, as sent to its own gateway (OpenCode Zen) according to
  third-party clients that imitate it; not verified against OpenCode's source.
"""

DEFAULT_SESSION_BODY_FIELDS: tuple[str, ...] = (
    "session_params.session_id",
    "prompt_cache_key",
    "user",
)
"""Body fields read for a session id when no session header is present, in order."""


def body_session_id(
    payload: Mapping[str, Any], fields: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[str, str] | None:
    """The first non-empty string among ``fields`` of ``payload`` and its label, or None.

    Args:
        payload: the parsed JSON body.
        fields: (label, path) pairs, e.g. ``("body:session_params.session_id",
            ("session_params", "session_id"))``.
    """
    for label, path in fields:
        value: Any = payload
        for part in path:
            if not isinstance(value, dict):
                value = None
                break
            value = value.get(part)
        if isinstance(value, str) and value.strip():
            return value, label
    return None
