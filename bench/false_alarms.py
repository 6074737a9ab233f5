#!/usr/bin/env python3
"""The detector's realised false-alarm rate against its budget, on streams with known truth.

A budget of ``alpha`` false alarms per switch-pulse means an in-control average run length of
``1 / alpha`` pulses to the first false alert. Fresh detectors (leaf0 of the default 4x4x2 fabric)
judge synthetic healthy streams with exactly their noise model (tests/synthetic.py, each spray mode
at its prior noise factor) until their first alert; the rate is ``1 / mean run length``, printed as
a multiple of the budget (1 = spent exactly, below 1 = budget left unused) with its standard error.
``--split bonferroni`` counts every CUSUM of a bank as independent, as the detector did before
agent/detector/banksplit.py, for the side-by-side figure.

    .venv/bin/python bench/false_alarms.py                       # 100 runs per spray mode
    .venv/bin/python bench/false_alarms.py --split correlated bonferroni --reps 60
    .venv/bin/python bench/false_alarms.py --magnitudes 0.001 0.0025 0.005 0.01 0.02 --min-rate 0.0005

Runtime: about a minute per spray mode and split with 60 runs, on one core.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agent.detector.switch as switch_mod  # noqa: E402
from agent.detector import DetectorConfig  # noqa: E402
from agent.detector.banksplit import budget_ln_arl  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402
from netns_testbed.topo import SprayMode  # noqa: E402
from tests.synthetic import run_lengths  # noqa: E402

CAP = 50_000       # pulses; a run that reaches it counts as that long (censored: the rate reads low)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sprays", nargs="+", default=["random", "rr", "rrdst"], choices=[s.value for s in SprayMode])
    ap.add_argument("--split", nargs="+", default=["correlated"], choices=["correlated", "bonferroni"])
    ap.add_argument("--reps", type=int, default=100, help="fresh detectors per row")
    ap.add_argument("--alpha", type=float, default=1e-3, help="budget: false alarms per switch-pulse")
    ap.add_argument("--packets", type=float, default=10_000, help="packets per source and pulse")
    ap.add_argument("--magnitudes", type=float, nargs="+", help="the bank's loss magnitudes (default: the detector's)")
    ap.add_argument("--min-rate", type=float, help="the detector's min_rate (default: its own)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.reps < 2 or not 0 < a.alpha < 0.1 or a.packets < 100:
        print("false_alarms: --reps >= 2, --alpha in (0, 0.1), --packets >= 100: fix the arguments", file=sys.stderr)
        return 2
    kw: dict = {"fa_per_day": a.alpha * 86400, "switches": 1, "rotations": 2}
    if a.magnitudes:
        kw["magnitudes"] = tuple(a.magnitudes)
    if a.min_rate is not None:
        kw["min_rate"] = a.min_rate
    try:
        cfg = DetectorConfig(**kw).validate()
    except SpecError as e:
        print(f"false_alarms: {e}", file=sys.stderr)
        return 2
    rows = []
    for split in a.split:
        # bonferroni: the bank's members counted as independent CUSUMs (the 1-D form of the budget)
        switch_mod.budget_ln_arl = (budget_ln_arl if split == "correlated" else
                                    lambda d, la, extra=0: budget_ln_arl(np.asarray(d).ravel(), la, extra))
        for spray in a.sprays:
            print(f"false_alarms: {split} {spray}: {a.reps} runs ...", file=sys.stderr, flush=True)
            rl = np.array(run_lengths(SprayMode(spray), cfg, a.reps, a.packets, a.seed, CAP), dtype=float)
            mean = float(rl.mean())
            rows.append({"split": split, "spray": spray, "runs": a.reps, "mean_run_length": round(mean, 1),
                         "rate_over_budget": round(1 / mean / a.alpha, 3),
                         "se": round(float(rl.std(ddof=1)) / math.sqrt(rl.size) / mean ** 2 / a.alpha, 3),
                         "censored": int((rl >= CAP).sum())})
    switch_mod.budget_ln_arl = budget_ln_arl
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(f"budget {a.alpha:g} per switch-pulse (in-control run length {1 / a.alpha:,.0f} pulses), "
          f"magnitudes {' '.join(f'{m:g}' for m in cfg.magnitudes)}, min_rate {cfg.min_rate:g}")
    print(f"{'split':>11} {'spray':>6} {'runs':>5} {'mean run length':>16} {'rate / budget':>14} {'censored':>8}")
    for r in rows:
        print(f"{r['split']:>11} {r['spray']:>6} {r['runs']:>5} {r['mean_run_length']:>16,.0f} "
              f"{r['rate_over_budget']:>8.2f} ± {r['se']:.2f} {r['censored']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
