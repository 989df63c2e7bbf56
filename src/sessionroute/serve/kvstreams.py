"""The KV event streams ``sessionroute serve --kv-events`` subscribes to: one per worker,
as ``URL=ENDPOINT[,REPLAY]`` specs (:func:`kv_streams`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KvStreamConfig", "kv_streams"]


@dataclass(frozen=True, slots=True)
class KvStreamConfig:
    """Where one worker's KV events arrive.

    Attributes:
        worker: the worker's url (as the router knows it).
        endpoint: the ZMQ address the router binds for the worker's publisher
            (``tcp://127.0.0.1:5557``).
        replay_endpoint: the server's replay socket (``tcp://HOST:PORT``), or None.
        topic: the publisher's topic (vLLM's default ``""``).
    """

    worker: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


def kv_streams(specs: tuple[str, ...] | list[str]) -> list[KvStreamConfig]:
    """Parse ``URL=ENDPOINT[,REPLAY]`` specs (``--kv-events``).

    Raises:
        ValueError: on a malformed spec or a worker named twice (the message has the value).
    """
    out: list[KvStreamConfig] = []
    seen: set[str] = set()
    for spec in specs:
        url, sep, rest = spec.partition("=")
        endpoint, _, replay = rest.partition(",")
        if not sep or not url.startswith(("http://", "https://")) or "://" not in endpoint:
            raise ValueError(
                f"--kv-events wants URL=ENDPOINT[,REPLAY] (e.g. "
                f"http://127.0.0.1:8000=tcp://127.0.0.1:5557), got {spec!r}"
            )
        if replay and "://" not in replay:
            raise ValueError(f"--kv-events replay address must be a ZMQ address, got {replay!r}")
        if url in seen:
            raise ValueError(f"--kv-events names worker {url!r} twice")
        seen.add(url)
        out.append(KvStreamConfig(url, endpoint, replay or None))
    return out
