"""The emulator's tokenizer, chat template and generated filler: determinism and round trips."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionroute.emulate import (
    FILLER_WORDS,
    ChatEncoder,
    HashTokenizer,
    filler_pieces,
    render_chat,
)
from sessionroute.emulate.service import output_seed

TOK = HashTokenizer()


def test_ids_are_crc32_of_the_piece() -> None:
    want = zlib.crc32(b" world")
    assert want == 0x4A3B42CB  # the IEEE CRC-32: the same on every run and platform
    assert TOK.pieces("hello world\n") == ["hello", " world", "\n"]
    assert TOK.encode("hello world\n")[1] == want
    assert HashTokenizer().encode("hello world") == TOK.encode("hello world")


def test_pieces_cover_the_text() -> None:
    text = "a<b <|user|>\n  x\t<|bad marker|> end<"
    pieces = TOK.pieces(text)
    assert "".join(pieces) == text
    assert "<|user|>" in pieces
    assert "<|bad marker|>" not in pieces  # a space cannot be inside a marker


def test_filler_words_are_distinct_single_pieces() -> None:
    assert len(set(FILLER_WORDS)) == 256
    for w in FILLER_WORDS:
        assert TOK.pieces(" " + w) == [" " + w]


def test_filler_is_deterministic_and_extends() -> None:
    a = filler_pieces(b"seed", 200)
    assert a == filler_pieces(b"seed", 200)
    assert filler_pieces(b"seed", 70) == a[:70]
    assert filler_pieces(b"other", 200) != a
    assert filler_pieces(b"seed", 0) == []
    with pytest.raises(ValueError, match="-1"):
        filler_pieces(b"seed", -1)


def test_output_seed_depends_on_prompt_and_nonce() -> None:
    assert output_seed([1, 2], b"greedy") == output_seed([1, 2], b"greedy")
    assert output_seed([1, 2], b"greedy") != output_seed([1, 3], b"greedy")
    assert output_seed([1, 2], b"greedy") != output_seed([1, 2], b"seed:1")


def test_chat_turns_extend_prompt_plus_output_token_for_token() -> None:
    msgs = [("system", "You are terse."), ("user", "Fix the bug, please.")]
    prompt1 = TOK.encode(render_chat(msgs))
    reply = filler_pieces(b"x", 37)
    text = "".join(reply)
    assert TOK.encode(text) == TOK.ids(reply)  # the reply round-trips
    msgs2 = [*msgs, ("assistant", text), ("user", "Now add a test.")]
    prompt2 = TOK.encode(render_chat(msgs2))
    assert prompt2[: len(prompt1) + 37] == prompt1 + TOK.ids(reply)


@given(
    st.text(alphabet=st.sampled_from("ab <|>\n\t.x"), max_size=40),
    st.integers(min_value=1, max_value=30),
    st.binary(max_size=8),
)
def test_completion_prompt_plus_output_round_trips(prompt: str, n: int, seed: bytes) -> None:
    # Whatever the prompt ends with, the space-led output never merges with it.
    out = filler_pieces(seed, n)
    assert TOK.encode(prompt + "".join(out)) == TOK.encode(prompt) + TOK.ids(out)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant", "tool"]),
            st.text(alphabet=st.sampled_from("ab <|>\n.x"), max_size=30),
        ),
        min_size=1,
        max_size=5,
    ),
    st.text(alphabet=st.sampled_from("ab <|>\n.x"), max_size=30),
)
def test_appending_a_message_extends_the_prompt(msgs: list[tuple[str, str]], more: str) -> None:
    base = TOK.encode(render_chat(msgs, add_generation_prompt=False))
    longer = TOK.encode(render_chat([*msgs, ("user", more)], add_generation_prompt=False))
    assert longer[: len(base)] == base


_ROLE = st.sampled_from(["system", "user", "assistant", "tool", "odd role", "x|y"])
_TEXT = st.text(alphabet=st.sampled_from("ab <|>\n.xé"), max_size=30)


@given(st.lists(st.tuples(_ROLE, _TEXT), max_size=6), st.booleans())
def test_chat_encoder_equals_encoding_the_rendered_text(
    msgs: list[tuple[str, str]], gen_prompt: bool
) -> None:
    enc = ChatEncoder(max_tokens=40)  # small: the memo evicts along the way
    want = TOK.encode(render_chat(msgs, add_generation_prompt=gen_prompt))
    assert enc.encode(msgs, add_generation_prompt=gen_prompt) == want
    assert enc.encode(msgs, add_generation_prompt=gen_prompt) == want  # from the memo
    assert enc.memo_tokens <= 40
