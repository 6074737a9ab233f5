#!/usr/bin/env python3
"""How far pulse boundaries move the spines' balance: the timing term of the owners' verdicts.

A spine's balance compares a leaf's outflow with its inflow, two different flows. A pulse boundary that
moves ``H`` packets from one pulse to the next adds ``H`` to one pulse's deficit and takes it from the
next one's, so consecutive deficits are negatively correlated: ``cov(r_t, r_t+1) = -var(H)``. Per run and
per period (before the first fault, under it), this prints the boundaries' sd as a share of a pulse's
expected count, sqrt(-lag-1 autocovariance) of the spines' per-pulse deficits per expected packet, every
judged cell of every spine pooled, and the ratio ``var(H) / loss rate`` that
``agent.detector.verdict.TIMING_VAR_PER_LOSS`` is the median of.

    .venv/bin/python bench/pulse_timing.py                       # the shipped runs (tests/data, bench/data)
    .venv/bin/python bench/pulse_timing.py RUN_DIR [RUN_DIR...]  # experiment run directories

A run directory holds report.json (spec, faults with their start times) and pulses/pulses-<switch>.jsonl[.gz].
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.replay import judged_run  # noqa: E402
from analysis.rundir import check_replayable  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [*sorted((ROOT / "tests/data/recorded-runs").glob("*/report.json")),
           *sorted((ROOT / "bench/data/timing-2x2x2").glob("*/report.json"))]


def boundary_sd(run: Path) -> tuple[float, dict[str, tuple[float, int]]]:
    """(the first fault's rate, per period: (boundary sd as a share of the expected count, pulse pairs))."""
    judge, report = judged_run(run)
    start = min(f["start"] for f in report["faults"] if f.get("start"))
    rate = min(f["rate"] for f in report["faults"] if f.get("start"))
    out: dict[str, tuple[float, int]] = {}
    for period in ("before", "fault"):
        covs, pairs = [], 0
        for det in judge.detectors.values():
            if det.owner.ledger is None:
                continue
            for cell in range(det.owner.ledger.ncells):
                y = [(float(a[cell] / bg[cell])) for t, a, b, bg, m in det.owner.ledger.rows
                     if m[cell] and bg[cell] > 0 and (t >= start) == (period == "fault")]
                if len(y) < 6:
                    continue
                e = np.asarray(y) - np.median(y)
                covs.append(float(np.mean(e[1:] * e[:-1])))
                pairs += len(y) - 1
        out[period] = (math.sqrt(max(0.0, -float(np.mean(covs)))) if covs else math.nan, pairs)
    return rate, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: .venv/bin/python bench/pulse_timing.py",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="run directories (default: the shipped ones)")
    args = ap.parse_args(argv)
    runs = args.runs or [p.parent for p in SHIPPED]
    try:
        check_replayable(*runs)
    except SpecError as e:
        print(f"pulse_timing: {e}", file=sys.stderr)
        return 2
    ratios = []
    print(f"{'run':40s} {'loss':>6s} {'before':>8s} {'fault':>8s} {'pairs':>6s} {'var/loss':>9s}")
    for r in runs:
        rate, per = boundary_sd(r)
        sd, pairs = per["fault"]
        ratio = sd * sd / rate if not math.isnan(sd) else math.nan
        if not math.isnan(ratio):
            ratios.append(ratio)
        print(f"{r.name:40s} {rate:6.2%} {per['before'][0]:8.2%} {sd:8.2%} {pairs:6d} {ratio:9.5f}")
    if ratios:
        print(f"median var/loss over {len(ratios)} runs: {float(np.median(ratios)):.5f} "
              f"(quartiles {np.percentile(ratios, 25):.5f}, {np.percentile(ratios, 75):.5f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
