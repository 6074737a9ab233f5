"""How much slower than a real machine this one runs: ``FLOWPULSE_SLOWDOWN``, a factor on wall-clock limits.

A job's deadline (workload/launcher.py) and the tests' waits are set for real hardware. The emulated
guest (guest/vm.py, no KVM: every instruction is translated) runs the same code many times slower, and a
job that is only slow there would be killed as stuck. The guest measures its own pace against the host's
with :func:`cpu_seconds` (the same Python loop on both; guest/vm.py) and exports the ratio as
``FLOWPULSE_SLOWDOWN``; every wall-clock limit that guards against a hang is multiplied by it. Unset, the
factor is 1. The detectors never read it: pulses, gaps and alerts are timed by the traffic itself.

  python -m netns_testbed.slowdown                 # seconds the reference loop takes here
  python -m netns_testbed.slowdown --against 0.21  # this machine's factor against a machine that took 0.21 s
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .errors import SpecError

ENV = "FLOWPULSE_SLOWDOWN"
#: the largest factor taken: an emulated guest measured 10-40x here; beyond this a limit means nothing
LIMIT = 200.0


def slowdown() -> float:
    """The factor from ``FLOWPULSE_SLOWDOWN`` (1 when unset); a bad value is the user's to fix (exit 2)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise SpecError(f"{ENV}={raw!r} is not a number: unset it, or give a factor such as 4") from None
    if not 1.0 <= factor <= LIMIT:
        raise SpecError(f"{ENV}={raw!r} is out of range: give a factor from 1 to {LIMIT:g}, or unset it")
    return factor


def cpu_seconds(rounds: int = 5) -> float:
    """The fastest of ``rounds`` runs of a fixed pure-Python loop, in seconds (about 0.1 s on a real core)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(1_000_000):
            acc ^= i * i
        best = min(best, time.perf_counter() - t0)
    return best


def factor_against(reference_s: float, here_s: float) -> float:
    """This machine's factor: how many times the reference machine's time the loop took here (1 at least)."""
    return min(LIMIT, max(1.0, here_s / reference_s))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netns_testbed.slowdown", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", type=float, metavar="SECONDS",
                   help="print the factor against a machine whose loop took SECONDS, not the seconds")
    a = p.parse_args(argv)
    if a.against is not None and not a.against > 0:
        p.error("--against takes the reference machine's seconds, above 0")
    here = cpu_seconds()
    print(f"{factor_against(a.against, here):.1f}" if a.against else f"{here:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
