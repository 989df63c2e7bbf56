"""Releases published by other routers (``--state-url``): the subscriber of the shared
state's pub/sub channel.

Every router publishes each session it releases on the channel
(:data:`sessionroute.serve.scripts.RELEASE`); every router drops its cached pin of it, so none
writes a released session back to Redis after Redis lost its data.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

__all__ = ["listen_for_releases"]

_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


async def listen_for_releases(
    url: str,
    channel: str,
    on_release: Callable[[str], object],
    timeout_s: float,
    reconnect_s: float,
) -> None:
    """Call ``on_release(session_id)`` for every message on ``channel`` at Redis ``url``,
    subscribing again ``reconnect_s`` seconds after a failure (connection timeout
    ``timeout_s``); runs until cancelled. Messages published while not subscribed are
    missed: Redis itself refuses the write-back of a session released lately
    (:data:`sessionroute.serve.state.RELEASE_MEMORY_S`)."""
    while True:
        client = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=timeout_s
        )
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    on_release(str(message["data"]))
        except _ERRORS:
            pass
        finally:
            with contextlib.suppress(*_ERRORS):
                await pubsub.aclose()
                await client.aclose()
        await asyncio.sleep(reconnect_s)
