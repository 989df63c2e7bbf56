#!/usr/bin/env python3
"""Check that a vLLM server's replies re-tokenise to the tokens it generated.

For each of a few multi-turn conversations (the live driver's words, forced outputs:
``temperature 0``, ``ignore_eos``), turn ``k + 1``'s prompt ids (``POST /tokenize`` of the
messages, with the reply as the server returned its text) must start with turn ``k``'s prompt
ids followed by the ids turn ``k`` generated (``logprobs`` with
``return_tokens_as_token_ids``). With the tiny model of ``sessionroute tiny-model`` they do;
a model whose replies do not survive detokenisation prints where they first differ. The
simulator's ``reply_reuse`` (docs/simulator.md) is the fraction that does.

Usage: ``python scripts/vllm_reply_roundtrip.py --url http://127.0.0.1:8000 [--turns 4]
[--sessions 3] [--max-tokens 64]``; exits 1 on a mismatch, 2 on an unreachable server.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

WORDS = ("baka", "dobe", "zimu", "kasi", "lugo", "nibi", "rabo", "teba")


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _prompt_ids(base: str, model: str, messages: list[dict[str, str]]) -> list[int]:
    doc = _post(
        f"{base}/tokenize", {"model": model, "messages": messages, "add_generation_prompt": True}
    )
    return [int(t) for t in doc["tokens"]]


def check(base: str, sessions: int, turns: int, max_tokens: int) -> tuple[int, int, list[str]]:
    """Returns (reply tokens checked, reply tokens repeated exactly, mismatch notes)."""
    model = _get(f"{base}/v1/models")["data"][0]["id"]
    checked = same = 0
    notes: list[str] = []
    for s in range(sessions):
        messages = [{"role": "user", "content": " ".join(WORDS[(s + i) % 8] for i in range(90))}]
        for k in range(turns):
            prompt = _prompt_ids(base, model, messages)
            doc = _post(
                f"{base}/v1/chat/completions",
                {
                    "model": model,
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "logprobs": True,
                    "return_tokens_as_token_ids": True,
                },
            )
            choice = doc["choices"][0]
            gen = [int(t["token"].split(":", 1)[1]) for t in choice["logprobs"]["content"]]
            text = choice["message"]["content"] or ""
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": " ".join(WORDS[(s + k + i) % 8] for i in range(20))},
            ]
            nxt = _prompt_ids(base, model, messages)
            if nxt[: len(prompt)] != prompt:
                notes.append(f"session {s} turn {k + 1}: the prompt itself changed")
            tail = nxt[len(prompt) : len(prompt) + len(gen)]
            n = next((i for i, (a, b) in enumerate(zip(tail, gen, strict=False)) if a != b), None)
            agree = len(gen) if n is None and len(tail) == len(gen) else (n or 0)
            checked += len(gen)
            same += agree
            if agree < len(gen):
                notes.append(
                    f"session {s} turn {k + 1}: reply differs from token {agree} of {len(gen)}"
                    f" (generated {gen[agree : agree + 4]}, re-tokenised {tail[agree : agree + 4]})"
                )
    return checked, same, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", required=True, help="server base URL")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    bad = False
    for url in args.url:
        base = url.rstrip("/")
        try:
            checked, same, notes = check(base, args.sessions, args.turns, args.max_tokens)
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            print(f"{base}: error: {exc}", file=sys.stderr)
            return 2
        for note in notes[:10]:
            print(f"{base}: {note}")
        print(
            f"{base}: {same} of {checked} reply tokens re-tokenise to the generated ids "
            f"({same / max(1, checked):.1%})"
        )
        bad = bad or same < checked
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
