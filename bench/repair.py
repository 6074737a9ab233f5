#!/usr/bin/env python3
"""Repairs: does an alert stay open while its loss stays, and how soon does it resolve once repaired?

Counter model, every switch's own detector and the live incident tracker (as ``agent --all``). Per case
(shape, collective size, link, drop rate) and seed, two runs:

* the loss from pulse 50 for ``--pulses`` pulses: alerts resolved while it stayed (false clears; each
  one is an operator's "resolved" and, once the alarm fires again, a second page) and incidents opened
  beyond the first;
* the loss from pulse 50 to 150, then repaired: the pulses from the repair to the last alert's
  resolution, and alerts still open 200 pulses after it.

``--streams``: the repair test alone on Gaussian streams of known truth (``tests/synthetic.py``) at 0.5,
1 and 2 sd per pulse: the mean run length to a false repair under a loss that stays at a budget of one
per 300 pulses, and at the default budget the alerts resolved during 50 pulses of a loss and the median
pulses to see the repair after them.

    .venv/bin/python bench/repair.py
    .venv/bin/python bench/repair.py --pulses 2000 --seeds 5 6 7
    .venv/bin/python bench/repair.py --streams
    .venv/bin/python bench/repair.py --streams --lcb-sd 0    # the estimate itself as the alternative

Runtime: about 70 s with the defaults on one core.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from agent.detector.config import DetectorConfig  # noqa: E402
import agent.detector.evidence as evidence  # noqa: E402
from agent.detector.evidence import repair_ln_arl  # noqa: E402
from analysis.model import ModelSpec  # noqa: E402
from analysis.modelrun import run_model  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from tests.synthetic import repair_run  # noqa: E402

ONSET, REPAIR, AFTER = 50, 150, 200
CASES = [("4x4x2", 4, "leaf1->spine2", 0.02), ("4x4x2", 4, "spine2->leaf1", 0.01), ("3x4x1", 1, "spine0->leaf2", 0.01),
         ("4x4x2", 1, "spine1->leaf3", 0.005), ("2x2x1", 1, "spine1->leaf0", 0.01), ("2x4x2", 16, "leaf0->spine3", 0.005),
         ("4x2x2", 4, "leaf2->spine0", 0.01), ("3x3x2", 1, "spine2->leaf1", 0.02)]


def spec_of(shape: str, size: int, seed: int) -> ModelSpec:
    leaves, spines, hosts = (int(x) for x in shape.split("x"))
    return ModelSpec(fabric=FabricSpec(leaves=leaves, spines=spines, hosts_per_leaf=hosts), size=size << 20, seed=seed)


def steady(spec: ModelSpec, link: str, rate: float, pulses: int) -> tuple[int, int]:
    """(alerts resolved while the loss stayed, incidents opened beyond the first)."""
    run = run_model(spec, ONSET + pulses, {ONSET: {"drop": {link: rate}}})
    clears = sum(a["event"] == "resolved" for a in run.alerts)
    opens = sum(e["event"] == "open" for e in run.incidents)
    return clears, max(opens - 1, 0)


def repaired(spec: ModelSpec, link: str, rate: float) -> tuple[int | None, int]:
    """(pulses from the repair to the last alert's resolution, alerts still open at the end)."""
    run = run_model(spec, REPAIR + AFTER, {ONSET: {"drop": {link: rate}}, REPAIR: {"drop": {}}})
    last: dict[str, int | None] = {}
    for a in run.alerts:
        if a["event"] == "alert":
            last[a["alert_id"]] = None
        elif a["event"] == "resolved":
            last[a["alert_id"]] = a["iteration"]
    still = sum(v is None for v in last.values())
    done = [v for v in last.values() if v is not None]
    return (max(done) - REPAIR if done and not still else None), still


def streams(n: int = 200) -> None:
    cfg = DetectorConfig()
    ln_day = repair_ln_arl(cfg.false_clears_per_day, cfg.pulse_hz)
    print(f"{'sd per pulse':>12s} {'mean run to a false repair (budget 1/300)':>42s} "
          f"{'resolved during the loss':>24s} {'median pulses to see the repair':>32s}")
    for delta in (0.5, 1.0, 2.0):
        rng = np.random.default_rng(int(delta * 10))
        runs = [repair_run(rng, delta, math.log(300), None, 3000) or 3000 for _ in range(n)]
        lags = [repair_run(rng, delta, ln_day, 50, 2000) for _ in range(n)]
        early = sum(x is not None and x < 0 for x in lags)
        print(f"{delta:12.1f} {np.mean(runs):42.0f} {f'{early} of {n}':>24s} "
              f"{np.median([2000 if x is None else x for x in lags]):32.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  .venv/bin/python bench/repair.py\n"
                                        "  .venv/bin/python bench/repair.py --pulses 2000 --seeds 5 6 7\n"
                                        "  .venv/bin/python bench/repair.py --streams --lcb-sd 0")
    ap.add_argument("--pulses", type=int, default=600, help="faulty pulses of the steady run (default 600)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6], help="model seeds (default 5 6)")
    ap.add_argument("--streams", action="store_true", help="the repair test on Gaussian streams instead (see above)")
    ap.add_argument("--lcb-sd", type=float, default=evidence.REPAIR_LCB_SD,
                    help=f"sds below the estimate the alternative holds (default {evidence.REPAIR_LCB_SD})")
    args = ap.parse_args()
    if not 0 <= args.lcb_sd <= 10:
        print("repair: --lcb-sd must be in [0, 10]", file=sys.stderr)
        return 2
    if args.pulses < 1:
        print("repair: --pulses must be at least 1", file=sys.stderr)
        return 2
    evidence.REPAIR_LCB_SD = args.lcb_sd
    if args.streams:
        streams()
        return 0
    t0 = time.time()
    clears = opens = still = 0
    lags = []
    print(f"{'seed':>4s} {'case':34s} {'false clears':>12s} {'extra opens':>11s} {'repair lag':>10s} {'still open':>10s}")
    for seed in args.seeds:
        for shape, size, link, rate in CASES:
            spec = spec_of(shape, size, seed)
            c, o = steady(spec, link, rate, args.pulses)
            lag, s = repaired(spec, link, rate)
            clears, opens, still = clears + c, opens + o, still + s
            if lag is not None:
                lags.append(lag)
            print(f"{seed:4d} {f'{shape} {size} MiB {link} {rate:.1%}':34s} {c:12d} {o:11d} "
                  f"{'-' if lag is None else lag:>10} {s:10d}", flush=True)
            print(f"[{time.time() - t0:4.0f}s]", file=sys.stderr)
    runs = len(args.seeds) * len(CASES)
    print(f"{runs} steady runs of {args.pulses} faulty pulses: {clears} alerts resolved while the loss stayed, "
          f"{opens} incidents opened again")
    if lags:
        print(f"{runs} repairs: last alert resolved a median of {statistics.median(lags)} pulses after the repair "
              f"(max {max(lags)}; all {sorted(lags)}), {still} alerts still open {AFTER} pulses after it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
