"""Session ids from the body (``session_params.session_id``, ``prompt_cache_key``, ``user``)
and the keys ``consistent_hash`` hashes them by (issue 40)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessionroute.errors import MalformedRequest
from sessionroute.router import RouterConfig
from sessionroute.router.requests import RequestBuilder
from sessionroute.router.session_keys import (
    AGENT_SESSION_HEADERS,
    DEFAULT_SESSION_BODY_FIELDS,
    ring_key,
)
from sessionroute.types import RouteRequest


def _req(
    b: RequestBuilder, body: dict[str, Any], headers: dict[bytes, bytes] | None = None
) -> RouteRequest:
    data = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **body})
    return b.from_http(headers or {}, [data.encode()], len(data), "r", "/v1/chat/completions")


@pytest.mark.parametrize(
    ("body", "sid", "origin"),
    [
        ({"session_params": {"session_id": "sp"}}, "sp", "body:session_params.session_id"),
        ({"prompt_cache_key": "pck"}, "pck", "body:prompt_cache_key"),
        ({"user": "u-1"}, "u-1", "body:user"),
        # the first configured field with a non-empty string wins
        ({"user": "u", "prompt_cache_key": "k"}, "k", "body:prompt_cache_key"),
        (
            {"user": "u", "session_params": {"session_id": "s"}},
            "s",
            "body:session_params.session_id",
        ),
        ({"user": 7, "prompt_cache_key": " "}, None, "x-session-id"),  # not strings / blank
        ({"session_params": "s"}, None, "x-session-id"),
        ({}, None, "x-session-id"),
    ],
)
def test_body_session_ids(body: dict[str, Any], sid: str | None, origin: str) -> None:
    b = RequestBuilder(RouterConfig(), needs_content=False)
    r = _req(b, body)
    assert (r.session_id, r.session_header) == (sid, origin)
    if sid is not None:
        assert b.origins[sid] == origin


def test_a_session_header_wins_over_the_body() -> None:
    b = RequestBuilder(RouterConfig(), needs_content=False)
    r = _req(b, {"prompt_cache_key": "k"}, {b"x-session-id": b"h"})
    assert (r.session_id, r.session_header) == ("h", "x-session-id")
    assert b.origins["h"] == "x-session-id"


def test_fields_are_configurable_and_can_be_switched_off() -> None:
    only_user = RequestBuilder(RouterConfig(session_body_fields=("user",)), needs_content=False)
    assert _req(only_user, {"prompt_cache_key": "k", "user": "u"}).session_id == "u"
    nested = RequestBuilder(
        RouterConfig(session_body_fields=("metadata.user_id",)), needs_content=False
    )
    assert _req(nested, {"metadata": {"user_id": "m"}}).session_header == "body:metadata.user_id"
    off = RequestBuilder(RouterConfig(session_body_fields=()), needs_content=False)
    assert _req(off, {"prompt_cache_key": "k"}).session_id is None
    assert RouterConfig().session_body_fields == DEFAULT_SESSION_BODY_FIELDS


def test_a_body_id_is_checked_like_a_header_id() -> None:
    b = RequestBuilder(RouterConfig(max_session_id_bytes=8), needs_content=False)
    with pytest.raises(MalformedRequest):
        _req(b, {"prompt_cache_key": "k" * 9})
    with pytest.raises(MalformedRequest):
        _req(b, {"user": "a\nb"})


def test_ring_keys_are_vllm_routers() -> None:
    """Measured against vllm-router 0.1.17 (tests/serve/test_session_keys.py compares the
    placements): a header id hashes as header:<name>:<id>, a session_params id as
    request:<id>."""
    assert ring_key("x-user-id", "a") == "header:x-user-id:a"
    assert ring_key("body:session_params.session_id", "a") == "request:a"
    assert ring_key("body:prompt_cache_key", "a") == "body:prompt_cache_key:a"


@pytest.mark.parametrize("name", AGENT_SESSION_HEADERS)
def test_agent_harness_headers_are_session_headers_by_default(name: str) -> None:
    b = RequestBuilder(RouterConfig(), needs_content=False)
    r = _req(b, {"user": "u"}, {name.encode(): b"conv-1"})  # a header wins over the body
    assert (r.session_id, r.session_header) == ("conv-1", name)
    # x-session-id still comes first
    r = _req(b, {}, {name.encode(): b"conv-1", b"x-session-id": b"s"})
    assert r.session_id == "s"


def test_a_finished_session_leaves_no_origin_behind() -> None:
    from sessionroute.clock import ManualClock
    from sessionroute.router import RoutingCore
    from sessionroute.router.policies import create_policy
    from sessionroute.router.state import Cluster

    policy = create_policy("sticky_least_loaded", clock=ManualClock())
    core = RoutingCore(policy, Cluster(["http://w1"]), RouterConfig())
    r = _req(core.requests, {}, {b"x-session-id": b"done"})
    core.complete(core.route(r))
    assert core.requests.origins["done"] == "x-session-id"
    assert core.finish_session("done")
    assert "done" not in core.requests.origins  # a soak of 36,000 sessions grew RSS 7 MiB
