"""Argument types of the ``sessionroute bench`` targets: a value out of range is refused by
``argparse`` (usage, one line naming the flag, exit status 2) before anything starts."""

from __future__ import annotations

import argparse

__all__ = ["at_least", "positive_float"]


def at_least(low: int) -> type[int]:
    """An ``argparse`` type: an integer >= ``low``.

    Returns:
        a callable ``str -> int`` raising :class:`argparse.ArgumentTypeError` for a value that
        is not an integer or is below ``low`` (its ``__name__`` is ``"int"``, which argparse
        names in "invalid int value").
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "int"
    return parse  # type: ignore[return-value]


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0.

    Raises:
        argparse.ArgumentTypeError: for anything else.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value
