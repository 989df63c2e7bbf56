"""Prompt text of live turns: sharing follows block keys; histories grow turn by turn."""

from __future__ import annotations

from sessionroute.emulate import HashTokenizer, render_chat
from sessionroute.experiments.live.text import WORDS, SessionText, TemplateOverhead, content_words
from sessionroute.workloads.content import BlockChain


def test_words_are_distinct_single_pieces() -> None:
    assert len(set(WORDS)) == 256
    tok = HashTokenizer()
    text = " ".join(WORDS)
    assert len(tok.encode(text)) == 256


def test_equal_keys_give_equal_words_and_distinct_keys_distinct_words() -> None:
    a = content_words([11, 12, 13], 16, 0, 48, b"a")
    b = content_words([11, 12, 99], 16, 0, 48, b"b")
    assert len(a) == len(b) == 48
    assert a[:32] == b[:32]
    assert a[32:] != b[32:]


def test_tokens_beyond_the_keys_depend_on_the_session() -> None:
    a = content_words([1], 16, 0, 40, b"s1")
    b = content_words([1], 16, 0, 40, b"s2")
    assert a[:16] == b[:16]
    assert a[16:] != b[16:]
    assert content_words([1], 16, 20, 30, b"s1") == a[20:30]


def test_history_grows_and_matches_the_emulator_token_count() -> None:
    bs = 16
    chain = BlockChain(bs)
    chain.append(1, 100)  # shared system prompt
    chain.append(2, 50)  # first message
    over = TemplateOverhead(first=6, per_turn=8)
    text = SessionText("s-1", bs, over)
    tok = HashTokenizer()
    msgs = text.next_messages(150, chain.keys)
    assert len(msgs) == 1
    prompt1 = render_chat([(m["role"], m["content"]) for m in msgs])
    assert len(tok.encode(prompt1)) == 150  # content words + 6 template tokens
    reply = " bada kofe dusi"  # 3 tokens, as the emulator would answer
    text.add_reply(reply, 3)
    chain.append(3, 3)
    chain.append(4, 40)
    msgs2 = text.next_messages(150 + 3 + 40, chain.keys)
    assert [m["role"] for m in msgs2] == ["user", "assistant", "user"]
    prompt2 = render_chat([(m["role"], m["content"]) for m in msgs2])
    assert prompt2.startswith(prompt1 + reply)  # the previous prompt and its output, verbatim
    assert len(tok.encode(prompt2)) == 193


def test_a_shorter_prompt_restarts_the_history() -> None:
    text = SessionText("s", 16)
    text.next_messages(100, [])
    text.add_reply("x", 10)
    msgs = text.next_messages(50, [])
    assert len(msgs) == 1
    assert len(msgs[0]["content"].split()) == 50


def test_a_failed_turn_leaves_an_empty_reply() -> None:
    text = SessionText("s", 16)
    text.next_messages(20, [])
    msgs = text.next_messages(40, [])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == ""
