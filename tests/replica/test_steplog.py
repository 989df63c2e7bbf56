"""The fast path's step log: end times and the longest step since any kept step, through
trims, equal a plain list of every step's (start, end)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionroute.replica.steplog import StepLog

# per step: its duration and, optionally, the step index (as a fraction of the steps so far)
# below which the log may forget
_STEPS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.001, 0.002, 0.005, 0.04]), st.none() | st.floats(0, 1)),
    min_size=1,
    max_size=200,
)


@given(_STEPS)
def test_log_matches_every_step(steps: list[tuple[float, float | None]]) -> None:
    log = StepLog()
    ends: list[float] = []
    durs: list[float] = []
    t = 0.0
    keep = 0  # oldest step the test still reads
    for dur, cut in steps:
        g = log.step_ended(t, t + dur)
        assert g == len(ends)
        ends.append(t + dur)
        durs.append((t + dur) - t)
        t += dur
        if cut is not None:
            keep = max(keep, int(cut * log.g))
            log.trim(keep)
        assert log.g == len(ends)
        assert log.base <= keep
        assert log.ends == ends[log.base :]
        for i in range(keep, log.g):
            assert log.longest_since(i) == max(durs[i:])


def test_trim_keeps_the_log_until_half_can_go() -> None:
    log = StepLog()
    for i in range(10):
        log.step_ended(float(i), float(i + 1))
    log.trim(5)  # 5 of 10: not more than half
    assert log.base == 0 and len(log.ends) == 10
    log.trim(6)
    assert log.base == 6 and log.ends == [7.0, 8.0, 9.0, 10.0]
