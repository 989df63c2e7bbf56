"""The one builder of the policy's request: the same view from HTTP and from a simulated turn."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.errors import MalformedRequest
from sessionroute.router import RouterConfig
from sessionroute.router.requests import (
    BYTES_PER_TOKEN,
    RequestBuilder,
    coarsen_block_keys,
    estimate_prompt_tokens,
    text_block_keys,
)
from sessionroute.types import RouteRequest


def _builder(**config: object) -> RequestBuilder:
    return RequestBuilder(RouterConfig.model_validate(config), needs_content=False)


def test_the_first_non_empty_session_header_wins_in_configured_order() -> None:
    b = _builder(session_headers=["X-Rollout", "x-user-id"])
    assert b.session({b"x-user-id": b"u", b"x-rollout": b"r"}) == ("r", "x-rollout")
    assert b.session({b"x-user-id": b"u", b"x-rollout": b" \t"}) == ("u", "x-user-id")
    assert b.session({b"x-user-id": b"u  "}) == ("u", "x-user-id")  # trailing blanks go
    assert b.session({b"x-session-id": b"s"}) is None  # not a configured header
    assert b.session({b"x-rollout": b"\xff\xfeid"}) == ("\ufffd\ufffdid", "x-rollout")


def test_a_simulated_turn_and_its_http_request_look_the_same_to_a_policy() -> None:
    b = _builder(session_headers=["x-session-id", "x-user-id"])
    for sid in ("rollout-7", "", "ünïcode"):
        prompt_tokens = 1234
        pad = prompt_tokens * BYTES_PER_TOKEN - len(b'{"prompt": ""}')
        body = json.dumps({"prompt": "x" * pad}).encode()  # any body of that size
        assert len(body) == prompt_tokens * BYTES_PER_TOKEN
        headers = {b"x-session-id": sid.encode()} if sid else {}
        live = b.from_http(headers, [body], len(body), "r1")
        sim = b.from_turn(sid or None, prompt_tokens, [], 16, "r1")
        assert live == sim
        assert live.prompt_tokens == prompt_tokens
        assert live.blocks is None  # the policy does not read content: no keys


def test_built_requests_are_whole_route_requests() -> None:
    """The builders, which pass the fields by position, put each in its place."""
    content = RequestBuilder(RouterConfig(content_block_tokens=4), needs_content=True)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "u", "content": "y" * 40}], "cache_salt": "c"}
    ).encode()
    for b in (_builder(), content):
        live = b.from_http({b"x-session-id": b"s"}, [body], len(body), "r1", "/v1/chat/completions")
        sim = b.from_turn("s", 20, list(range(5)), 4, "r2", "c")
        for req in (live, sim):
            assert type(req) is RouteRequest and len(req) == len(RouteRequest._fields)
        assert live == RouteRequest(
            session_id="s",
            prompt_tokens=len(body) // BYTES_PER_TOKEN,
            blocks=text_block_keys("y" * 40, 16) if b.needs_content else None,
            model="m" if b.needs_content else None,
            request_id="r1",
            stream=False,
            cache_salt="c" if b.needs_content else None,
        )


def test_the_size_estimate_is_body_bytes_over_four() -> None:
    assert [estimate_prompt_tokens(n) for n in (0, 3, 4, 4001)] == [0, 0, 1, 1000]


def test_content_keys_from_text_share_exactly_the_shared_prefix_blocks() -> None:
    a = text_block_keys("a" * 64 + "b" * 64 + "c" * 70, 64)
    b = text_block_keys("a" * 64 + "b" * 64 + "d" * 64, 64)
    assert len(a) == 3 and len(b) == 3  # full blocks only
    assert a[:2] == b[:2] and a[2] != b[2]
    assert text_block_keys("a" * 63, 64) == []
    with pytest.raises(ValueError, match="block_bytes"):
        text_block_keys("abc", 0)


@given(
    keys=st.lists(st.integers(0, 2**64 - 1), max_size=40),
    kv=st.sampled_from([1, 16, 64, 256]),
    content=st.sampled_from([1, 16, 64, 256, 512]),
)
def test_coarsened_keys_are_the_last_kv_block_of_each_content_block(
    keys: list[int], kv: int, content: int
) -> None:
    prompt = len(keys) * kv
    out = list(coarsen_block_keys(keys, prompt, kv, content))
    expected: list[int] = []
    last = -1
    for j in range(1, prompt // content + 1):
        i = j * content // kv - 1  # the KV block that ends last inside content block j
        if i > last:
            expected.append(keys[i])
            last = i
    assert out == expected


def test_content_policies_get_block_keys_and_bad_json_is_refused() -> None:
    b = RequestBuilder(RouterConfig(content_block_tokens=4), needs_content=True)
    text = "You are an agent. " * 10
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    req = b.from_http({}, [body[:10], body[10:]], len(body), "r")
    assert req.blocks == text_block_keys(text, 4 * BYTES_PER_TOKEN) and req.model == "m"
    assert req.session_id is None and req.session_header == "x-session-id"
    with pytest.raises(MalformedRequest, match="not valid JSON"):
        b.from_http({}, [b"{"], 1, "r")
    turn = b.from_turn("s", 20, list(range(5)), 4, "r")  # 5 KV blocks of 4 = 5 content blocks
    assert turn.blocks == [0, 1, 2, 3, 4]


def test_session_ids_over_the_limit_or_with_control_characters_are_refused() -> None:
    b = _builder(max_session_id_bytes=8)
    assert b.session({b"x-session-id": b"12345678"}) == ("12345678", "x-session-id")
    for bad, match in ((b"123456789", "9 bytes exceeds the limit of 8"), (b"a\x00b", "control")):
        with pytest.raises(MalformedRequest, match=match):
            b.session({b"x-session-id": bad})
    for ctl in (b"a\tb", b"a\x7fb", b"\x1b[31m"):
        with pytest.raises(MalformedRequest, match="control"):
            b.session({b"x-session-id": ctl})


def test_bodies_are_validated_under_every_policy_and_compressed_ones_pass_unread() -> None:
    b = _builder()
    with pytest.raises(MalformedRequest, match="non-empty list"):
        b.from_http({}, [b'{"model": "m"}'], 14, "r", "/v1/chat/completions")
    gz = {b"content-encoding": b"gzip"}
    assert b.from_http(gz, [b"\x1f\x8b"], 2, "r", "/v1/chat/completions").prompt_tokens == 0
    content = RequestBuilder(RouterConfig(), needs_content=True)
    with pytest.raises(MalformedRequest, match="compressed"):
        content.from_http(gz, [b"\x1f\x8b"], 2, "r", "/v1/chat/completions")


@given(
    keys=st.lists(st.integers(0, 2**64 - 1), max_size=40),
    kv=st.sampled_from([1, 16, 48, 64, 256]),
    content=st.sampled_from([1, 16, 32, 64, 96, 256, 512]),
    prompt=st.integers(0, 50 * 256),
)
def test_coarsening_any_prompt_length_matches_the_block_by_block_rule(
    keys: list[int], kv: int, content: int, prompt: int
) -> None:
    out = list(coarsen_block_keys(keys, prompt, kv, content))
    expected: list[int] = []
    last = -1
    for j in range(1, prompt // content + 1):
        i = j * content // kv - 1
        if i > last and i < len(keys):
            expected.append(keys[i])
            last = i
    assert out == expected


def test_the_session_id_cache_keeps_every_check() -> None:
    """Ids are cached by the header value as sent: with or without trailing blanks the same
    id; an invalid value is refused every time, also after a valid one was cached (and a
    valid one is not refused after an invalid one); blanks only are no id, every time."""
    from sessionroute.router.requests import SESSION_ID_CACHE

    b = _builder(max_session_id_bytes=8)
    for _ in range(2):
        assert b.session({b"x-session-id": b"abc"}) == ("abc", "x-session-id")
        assert b.session({b"x-session-id": b"abc \t"}) == ("abc", "x-session-id")
        assert b.session({b"x-session-id": b" \t "}) is None
        for bad in (b"abc\x01", b"abc\x01 ", b"123456789", b"123456789 "):
            with pytest.raises(MalformedRequest):
                b.session({b"x-session-id": bad})
        assert b.session({b"x-session-id": b"12345678 "}) == ("12345678", "x-session-id")
    for i in range(SESSION_ID_CACHE + 5):  # past the bound: the oldest are checked again
        assert b.session({b"x-session-id": b"s%d" % i}) == (f"s{i}", "x-session-id")
    assert b.session({b"x-session-id": b"abc"}) == ("abc", "x-session-id")
    with pytest.raises(MalformedRequest):
        b.session({b"x-session-id": b"abc\x01"})
