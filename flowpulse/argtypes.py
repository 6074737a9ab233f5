"""argparse ``type=`` parsers for numbers: one place that refuses ``nan``, infinities and values out of range.

``float("nan")`` and ``float("inf")`` parse, and every comparison with a NaN is false, so a range check
written ``if x < 0`` lets it through: every float flag goes through :func:`number` instead, and is told
as one line (argparse's, exit 2).
"""
from __future__ import annotations

import argparse
import math


def number(low: float | None = None, high: float | None = None, *, above: bool = False, below: bool = False):
    """A parser for a finite number in ``[low, high]`` (``above``: strictly above ``low``; ``below``:
    strictly below ``high``)."""
    lo = "" if low is None else f"{'>' if above else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if below else '<='} {high:g}"
    want = " and ".join(x for x in (lo, hi) if x)

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (v <= low if above else v < low) or high is not None and (v >= high if below else v > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a number {want}")
        return v

    parse.__name__ = "number"      # argparse names the type in its messages
    return parse


def choice(enum_cls):
    """A parser for one of an enum's values: the member, so the command gets the type, not a string
    (argparse's one line naming the choices otherwise). Use with ``choices=list(enum_cls)``."""
    names = ", ".join(str(m.value) for m in enum_cls)

    def parse(text: str):
        try:
            return enum_cls(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid choice {text!r}: choose one of {names}") from None

    parse.__name__ = enum_cls.__name__
    return parse


SECONDS = number(0, above=True)        # a duration or timeout, > 0
MILLISECONDS = number(0)               # an idle time, >= 0
RATE = number(0, 1)                    # a loss rate
PER_SECOND = number(0, above=True)
