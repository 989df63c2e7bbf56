"""The tiny model may generate only space-led whole words (replies that round-trip)."""

from __future__ import annotations

import pytest

from sessionroute.experiments.live.text import WORDS
from sessionroute.experiments.live.tiny_model import reply_token_ids


def test_reply_token_ids_are_the_space_led_words() -> None:
    vocab = {"<|end|>": 0, "ba": 1, "\u0120": 2}
    vocab.update({"\u0120" + w: 10 + i for i, w in enumerate(reversed(WORDS))})
    ids = reply_token_ids(vocab)
    assert ids == list(range(10, 10 + len(WORDS)))
    assert 0 not in ids and 1 not in ids and 2 not in ids


def test_reply_token_ids_refuses_a_vocabulary_without_the_words() -> None:
    with pytest.raises(ValueError, match="not one space-led token"):
        reply_token_ids({"\u0120" + WORDS[0]: 3})
