#!/usr/bin/env python3
"""How much a cell's bank of CUSUMs overlaps, and what the switch's budget split gains from it.

Every cell runs one CUSUM per loss magnitude on the same standardised deficit, so the members
false-alarm together more often than apart. agent/detector/banksplit.py counts a bank as its
*effective* members (Hunter's bound along the chain of magnitudes, each adjacent pair's count ``g``
from a two-dimensional Markov chain) and gives each CUSUM ``ARL0 = n_effective / alpha``.

For a bank of the detector's magnitudes (``--magnitudes``, default the detector's; the smallest
member's standardised shift ``--delta``) it prints, per in-control ln ARL, each adjacent pair's
``g`` and the bank's effective count. With ``--mc N`` also N simulated runs of the whole bank (all
members on one stream, thresholds from the split at that ln ARL): the bank's run length to its first
false alarm in units of the budget's (1.0 = the budget spent exactly; above 1: budget left over),
beside the same bank split by Bonferroni. Monte Carlo only up to ln ARL 9 (its runs grow as e^ln ARL).

    .venv/bin/python bench/bank_split.py
    .venv/bin/python bench/bank_split.py --delta 0.05 0.2 0.8 --mc 3000
    .venv/bin/python bench/bank_split.py --magnitudes 0.001 0.0025 0.005 0.01 0.02 --json

Runtime: a second without ``--mc``; about 10 s per (delta, ln ARL) with ``--mc 3000``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector.arl import ln_arl_at_zero, thresholds  # noqa: E402
from agent.detector.banksplit import effective_members, pair_g  # noqa: E402
from agent.detector.config import DetectorConfig  # noqa: E402
from tests.montecarlo import bank_run_lengths  # noqa: E402


def bank_run_length(d: np.ndarray, ln_a: float, n: int, seed: int) -> float:
    """Mean pulses to the bank's first false alarm over n runs (members on one stream per run)."""
    return float(bank_run_lengths(d, thresholds(d, ln_a), n, seed).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--magnitudes", type=float, nargs="+", default=list(DetectorConfig().magnitudes),
                    help="the bank's loss magnitudes (default: the detector's)")
    ap.add_argument("--delta", type=float, nargs="+", default=[0.05, 0.2, 0.8],
                    help="the smallest member's standardised shift (the others scale with their magnitude)")
    ap.add_argument("--ln-arl", type=float, nargs="+", default=[6.0, 8.0, 11.0, 14.0, 18.0],
                    help="each member's in-control ln ARL")
    ap.add_argument("--mc", type=int, default=0, metavar="N", help="simulated bank runs per row (0: none)")
    ap.add_argument("--json", action="store_true", help="rows as JSON on stdout")
    a = ap.parse_args(argv)
    if any(not 0 < m < 1 for m in a.magnitudes) or any(d <= 0 for d in a.delta) or a.mc < 0:
        print("bank_split: magnitudes in (0, 1), shifts above 0 and --mc >= 0: fix the arguments", file=sys.stderr)
        return 2
    mags = np.sort(np.array(a.magnitudes))
    rows = []
    for d0 in a.delta:
        d = d0 * mags / mags[0]
        for ln_a in a.ln_arl:
            row = {"delta": d.round(4).tolist(), "ln_arl": ln_a,
                   "g": [round(pair_g(d[k], d[k + 1], ln_a), 3) for k in range(d.size - 1)],
                   "effective": round(float(effective_members(d.reshape(-1, 1), ln_a)[0]), 3)}
            if a.mc and ln_a <= 9.0:
                print(f"bank_split: simulating delta {d0} ln ARL {ln_a} ...", file=sys.stderr)
                budget = math.exp(ln_a) / row["effective"]               # the bank's run length the split asks
                row["mc_split"] = round(bank_run_length(d, ln_a, a.mc, 1) / budget, 3)
                # Bonferroni: every live member counted whole, the same budget
                live = float((ln_arl_at_zero(d) < ln_a).sum())
                row["mc_bonferroni"] = round(bank_run_length(d, ln_a + math.log(live / row["effective"]), a.mc, 2)
                                             / budget, 3)
            rows.append(row)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(f"magnitudes {' '.join(f'{m:g}' for m in mags)}: per adjacent pair g (2 = apart, 1 = one member), "
          f"the bank's effective count of {mags.size}")
    head = f"{'shifts':>28} {'ln ARL':>6} {'pairs g':>28} {'effective':>9}"
    print(head + (f" {'MC split':>8} {'MC Bonf.':>8}" if a.mc else ""))
    for r in rows:
        line = (f"{' '.join(f'{x:g}' for x in r['delta']):>28} {r['ln_arl']:>6g} "
                f"{' '.join(f'{g:.2f}' for g in r['g']):>28} {r['effective']:>9.2f}")
        if "mc_split" in r:
            line += f" {r['mc_split']:>8.2f} {r['mc_bonferroni']:>8.2f}"
        print(line)
    if a.mc:
        print("MC: the bank's run length to its first false alarm over the split's budget (1 = spent exactly)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
