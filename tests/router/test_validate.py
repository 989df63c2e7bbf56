"""The validation rules of generation requests (media type, body shape), checked directly."""

from __future__ import annotations

import pytest

from sessionroute.errors import MalformedRequest
from sessionroute.router.validate import (
    InvalidJSON,
    UnsupportedMediaType,
    check_media_type,
    parse_body,
)


@pytest.mark.parametrize(
    "value",
    [
        b"application/json",
        b"application/json; charset=utf-8",
        b"APPLICATION/JSON",
        b"application/x+json",
    ],
)
def test_json_media_types_pass(value: bytes) -> None:
    check_media_type(value)


@pytest.mark.parametrize("value", [None, b"text/plain", b"application/jsonx", b"", b"json"])
def test_other_media_types_are_415(value: bytes | None) -> None:
    with pytest.raises(UnsupportedMediaType, match="expected 'Content-Type: application/json'"):
        check_media_type(value)


def test_bodies_parse_strictly_and_report_where() -> None:
    assert parse_body(b'{"model": "m", "messages": [{"role": "user"}]}', "/v1/chat/completions")
    for bad, match in (
        (b"", "empty"),
        (b'{"a": 1', "EOF while parsing"),
        (b'{"a": Infinity}', "not valid JSON"),
        (b'{"a": "\xc3"}', "not valid JSON"),
        (b"[" * 5000, "not valid JSON"),  # nesting too deep, not a crash
    ):
        with pytest.raises(InvalidJSON, match=match):
            parse_body(bad, "/v1/chat/completions")
    with pytest.raises(MalformedRequest, match="must be a JSON object, got an empty list"):
        parse_body(b"[]", "/v1/completions")
    with pytest.raises(MalformedRequest, match="'model' must be a string, got a boolean"):
        parse_body(b'{"model": true, "prompt": "p"}', "/v1/completions")
    assert parse_body(b'{"prompt_embeds": "..."}', "/v1/completions")  # vLLM's alternative
    assert parse_body(b'{"messages": [{"role": "user"}]}', "/v1/embeddings")
    assert parse_body(b"{}", "/v1/other") == {}  # routes without a shape: object only


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "'messages' must be a non-empty list of objects (missing)"),
        (b'{"messages": []}', "'messages' must be a non-empty list of objects (an empty list)"),
        (b'{"messages": "hi"}', "'messages' must be a non-empty list of objects (a string)"),
        (b'{"messages": [{"role": "user"}, 3]}', "messages[1] must be an object, got a number"),
        (b'{"messages": [{"role": "user"}, {}]}', "messages[1] needs a string 'role'"),
        (b'{"messages": [{"role": null}]}', "messages[0] needs a string 'role'"),
    ],
)
def test_chat_messages_are_checked_element_by_element(body: bytes, message: str) -> None:
    """Each broken ``messages`` shape gets its own message, naming the first bad element."""
    with pytest.raises(MalformedRequest) as err:
        parse_body(body, "/v1/chat/completions")
    assert str(err.value) == message
    assert isinstance(parse_body(body, "/v1/other"), dict)  # the chat route's check only
