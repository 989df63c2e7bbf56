"""Multi-turn rollouts with the OpenAI SDK through ``sessionroute serve``.

Each rollout is one conversation: every turn resends the growing history, tagged with the
rollout's ``x-session-id``, so a session-aware router keeps it on the replica that already holds
its prefix in cache. When the rollout ends (or fails, or is cancelled) its session is released
with ``POST /finish_session``. Works against any OpenAI-compatible endpoint; where there is no
``/finish_session`` the release fails quietly (logged at debug) and the rollout is unaffected.

    sessionroute serve --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 \\
        --policy sticky_least_loaded &
    python examples/rollout_openai.py --router http://127.0.0.1:30000 --turns 4 --rollouts 8
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass

import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam

from sessionroute.client import Rollout, SessionReleaser


@dataclass(frozen=True)
class TurnResult:
    """One turn of one rollout, as printed."""

    rollout: int
    session_id: str
    turn: int
    prompt_tokens: int | None
    cached_tokens: int | None
    seconds: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line: ``--router URL --turns N`` and a few knobs (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", default="http://127.0.0.1:30000", help="router root URL")
    parser.add_argument("--turns", type=int, default=3, help="turns per rollout (>= 1)")
    parser.add_argument("--rollouts", type=int, default=1, help="concurrent rollouts (>= 1)")
    parser.add_argument("--model", default=None, help="model name (default: first /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens per turn")
    parser.add_argument("--api-key", default=None, help="the router's --router-api-key")
    parser.add_argument("--max-retries", type=int, default=2, help="OpenAI SDK retries per turn")
    parser.add_argument("--stream", action="store_true", help="stream every reply")
    parser.add_argument("--no-release", action="store_true", help="skip /finish_session")
    args = parser.parse_args(argv)
    for name, low in (("turns", 1), ("rollouts", 1), ("max_tokens", 1), ("max_retries", 0)):
        if getattr(args, name) < low:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must be >= {low}, got {getattr(args, name)}")
    return args


async def _ask(
    rollout: Rollout,
    args: argparse.Namespace,
    model: str,
    history: list[ChatCompletionMessageParam],
) -> tuple[str, CompletionUsage | None]:
    """One turn; returns ``(reply text, usage or None)``."""
    client = rollout.openai
    if not args.stream:
        reply = await client.chat.completions.create(
            model=model, messages=history, max_tokens=args.max_tokens
        )
        return reply.choices[0].message.content or "", reply.usage
    stream = await client.chat.completions.create(
        model=model,
        messages=history,
        max_tokens=args.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts: list[str] = []
    usage: CompletionUsage | None = None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    return "".join(parts), usage


async def one_rollout(
    index: int, args: argparse.Namespace, model: str, releaser: SessionReleaser | None
) -> list[TurnResult]:
    """Run one multi-turn conversation; the session is released when it ends."""
    results: list[TurnResult] = []
    async with Rollout(
        args.router,
        api_key=args.api_key,
        release=False if args.no_release else None,  # None: release (the default)
        releaser=releaser,
        openai_kwargs={"max_retries": args.max_retries},
    ) as rollout:
        history: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "You are a terse coding agent."}
        ]
        for turn in range(1, args.turns + 1):
            history.append({"role": "user", "content": f"Step {turn}: run the tests again."})
            start = time.perf_counter()
            text, usage = await _ask(rollout, args, model, history)
            seconds = time.perf_counter() - start
            history.append({"role": "assistant", "content": text})
            details = usage.prompt_tokens_details if usage is not None else None
            results.append(
                TurnResult(
                    rollout=index,
                    session_id=rollout.session_id,
                    turn=turn,
                    prompt_tokens=usage.prompt_tokens if usage is not None else None,
                    cached_tokens=details.cached_tokens if details is not None else None,
                    seconds=seconds,
                )
            )
    return results


async def run(args: argparse.Namespace) -> list[TurnResult]:
    """Discover the model if needed, run ``--rollouts`` rollouts concurrently, return all turns."""
    model = args.model
    if model is None:
        probe_kwargs = {"max_retries": args.max_retries}
        async with Rollout(
            args.router, api_key=args.api_key, release=False, openai_kwargs=probe_kwargs
        ) as probe:
            models = await probe.openai.models.list()
            model = models.data[0].id
    async with SessionReleaser(args.router, api_key=args.api_key) as releaser:
        per_rollout = await asyncio.gather(
            *(one_rollout(i, args, model, releaser) for i in range(args.rollouts))
        )
    return [turn for turns in per_rollout for turn in turns]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the rollouts, print one line per turn.

    Returns:
        0 on success, 1 when the router could not be reached or answered an error.
    """
    args = parse_args(argv)
    try:
        results = asyncio.run(run(args))
    except openai.APIError as exc:
        print(f"error: {args.router}: {exc}", file=sys.stderr)
        return 1
    print(f"{'rollout':>7} {'session_id':<32} {'turn':>4} {'prompt':>7} {'cached':>7} {'s':>7}")
    for r in results:
        prompt = "-" if r.prompt_tokens is None else str(r.prompt_tokens)
        cached = "-" if r.cached_tokens is None else str(r.cached_tokens)
        cells = f"{r.rollout:>7} {r.session_id:<32} {r.turn:>4} {prompt:>7} {cached:>7}"
        print(f"{cells} {r.seconds:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
