"""Ctrl-C during a live arm always ends the run with KeyboardInterrupt (exit status 130)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from sessionroute.experiments.live.runner import _interruptible


async def _absorbs_cancellation() -> str:
    """A run whose cleanup absorbs the cancellation, as some libraries' cleanups do."""
    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(5)
    return "finished"


def test_plain_asyncio_run_loses_the_interrupt() -> None:
    # The failure _interruptible exists for: asyncio.run returns normally.
    assert asyncio.run(_absorbs_cancellation()) == "finished"


def test_sigint_ends_in_keyboard_interrupt_even_when_cancellation_is_absorbed() -> None:
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(_interruptible(_absorbs_cancellation()))


def test_without_sigint_the_result_comes_back() -> None:
    async def quick() -> int:
        return 7

    assert asyncio.run(_interruptible(quick())) == 7
