"""The emulator's tokenizer on the router (``serve --kv-tokenizer emulator``).

``sessionroute emulate`` tokenizes with its own word-level hashing tokenizer and chat template
(:mod:`sessionroute.router.kv.wordtokens`), not a Hugging Face model's. A router in front of
emulated replicas that publish KV events gives ``--kv-tokenizer emulator`` to compute the same
token ids, hence the same vLLM block hashes, from a request body as the emulator's OpenAI
endpoints do (``sessionroute.emulate.app``): chat ``messages`` are rendered with the emulator's
template (each message's text is its string content, or its text parts joined by ``"\\n"``,
then its ``tool_calls`` as compact sorted JSON; the generation prompt unless
``add_generation_prompt`` is false) and encoded message by message with a memo (a conversation's
next turn tokenizes only its new messages); a string ``prompt`` is encoded as it is, token ids
are taken as they are.
"""

from __future__ import annotations

import json
from typing import Any

from sessionroute.router.kv.wordtokens import ChatEncoder, HashTokenizer

__all__ = ["EMULATOR_TOKENIZER", "EmulatorEncoder"]

EMULATOR_TOKENIZER = "emulator"
"""The ``--kv-tokenizer`` value that selects :class:`EmulatorEncoder`."""


def _message_text(message: dict[str, Any]) -> str | None:
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    else:
        return None
    calls = message.get("tool_calls")
    if calls:
        text += json.dumps(calls, sort_keys=True, separators=(",", ":"))
    return text


class EmulatorEncoder:
    """Token ids of OpenAI request bodies as ``sessionroute emulate`` computes them.

    Args:
        max_tokens: bound of the per-message memo (tokens).
    """

    def __init__(self, max_tokens: int = 4_000_000) -> None:
        self.tokenizer = HashTokenizer()
        self.chat = ChatEncoder(self.tokenizer, max_tokens)

    def token_ids(self, payload: Any) -> list[int] | None:
        """The prompt's token ids, or None when the body has no prompt the emulator takes."""
        if not isinstance(payload, dict):
            return None
        messages = payload.get("messages")
        if isinstance(messages, list):
            pairs: list[tuple[str, str]] = []
            for m in messages:
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    return None
                text = _message_text(m)
                if text is None:
                    return None
                pairs.append((m["role"], text))
            gen = payload.get("add_generation_prompt", True)
            return self.chat.encode(pairs, add_generation_prompt=gen is not False)
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
        return None
