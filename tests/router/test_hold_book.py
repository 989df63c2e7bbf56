"""``adaptive_hold``'s hold book (:class:`HoldBook`): its counters cannot be moved from
outside, and ending a hold adds its seconds to the session's held time."""

from __future__ import annotations

from sessionroute.router.policies._hold_book import ENDINGS, HoldBook


def test_a_hold_ends_into_the_sessions_held_time_and_the_counts_stay_the_books() -> None:
    book = HoldBook()
    book.place("s1", "w1", 0.0)
    hold = book.begin("s1", "w1", tokens=500, now=1.0, until=4.0)
    book.end(hold, "bound", 9.0)  # past its bound: held until 4.0
    assert book.held_s("s1") == 3.0 and book.hold_s_total == 3.0
    released = book.released
    assert released == dict.fromkeys(ENDINGS, 0) | {"bound": 1}
    released["bound"] = 99  # a caller's change does not reach the book
    assert book.released["bound"] == 1 and book.counters()["released"]["bound"] == 1
    book.forget("s1")
    assert book.held_s("s1") == 0.0 and book.members("w1") == {}
