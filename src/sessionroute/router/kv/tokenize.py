"""The servers' tokenizer on the router: an OpenAI request body -> the prompt's token ids.

Loaded from a local Hugging Face model directory (``tokenizer.json`` through the ``tokenizers``
library; the chat template from ``chat_template.jinja`` or ``tokenizer_config.json``'s
``chat_template``, rendered with ``jinja2`` in a sandbox as ``transformers`` does). The ids
follow vLLM's OpenAI server:

* chat (``messages``): the template rendered with ``add_generation_prompt=True``, then encoded
  without special tokens (the template writes them);
* completions (``prompt`` as a string): encoded with the tokenizer's special tokens (BOS);
  a ``prompt`` given as token ids is taken as it is.

Anything else (tools, multimodal parts, ``continue_final_message``, custom template kwargs) may
render differently from the server; such a request then matches less of the cache, it is never
refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError

__all__ = ["RequestEncoder", "load_encoder"]


class RequestEncoder:
    """Token ids of OpenAI request bodies for one model (see the module docstring).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        chat_template: the Jinja chat template source, or None (chat requests then have no
            token ids).
        special_tokens: template variables such as ``bos_token`` / ``eos_token``.
    """

    def __init__(
        self, tokenizer: Any, chat_template: str | None, special_tokens: Mapping[str, str]
    ) -> None:
        self.tokenizer = tokenizer
        self._template: Any = None
        self._special = dict(special_tokens)
        if chat_template is not None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(chat_template)

    def encode_text(self, text: str, *, special: bool) -> list[int]:
        """``text``'s token ids, with the tokenizer's special tokens when ``special``."""
        return list(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def render_chat(self, messages: Sequence[Any]) -> str:
        """The chat template applied to ``messages`` with a generation prompt.

        Raises:
            ValueError: when the model has no chat template or the template fails.
        """
        if self._template is None:
            raise ValueError("the model has no chat template")
        try:
            return str(
                self._template.render(
                    messages=messages, add_generation_prompt=True, **self._special
                )
            )
        except Exception as exc:  # jinja2's TemplateError and errors raised by the template
            raise ValueError(f"chat template failed: {exc}") from exc

    def token_ids(self, payload: Any) -> list[int] | None:
        """The prompt's token ids of a request body, or None when it has no prompt this
        encoder understands (the policy then routes by load alone)."""
        if not isinstance(payload, dict):
            return None
        messages = payload.get("messages")
        if isinstance(messages, list):
            try:
                return self.encode_text(self.render_chat(messages), special=False)
            except ValueError:
                return None
        prompt = payload.get("prompt")
        if isinstance(prompt, str):
            return self.encode_text(prompt, special=True)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
        return None


def load_encoder(model_dir: str | Path) -> RequestEncoder:
    """The :class:`RequestEncoder` of a local model directory.

    Raises:
        ConfigError: when the directory has no readable ``tokenizer.json``.
    """
    from tokenizers import Tokenizer

    root = Path(model_dir)
    path = root / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise ConfigError(f"cannot load tokenizer {str(path)!r}: {exc}") from None
    config: dict[str, Any] = {}
    cfg_path = root / "tokenizer_config.json"
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ConfigError(f"{str(cfg_path)!r} is not valid JSON: {exc}") from None
    template = config.get("chat_template")
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    special = {
        k: v
        for k in ("bos_token", "eos_token", "pad_token", "unk_token")
        if isinstance(v := config.get(k), str)
    }
    return RequestEncoder(tokenizer, template if isinstance(template, str) else None, special)
