#!/usr/bin/env python3
"""How fast a spine's own balance test fires on a link it owns (not the verdict a leaf's alert asks for).

A drop on ``leaf1->spine2`` of a 4x4x2 fabric (rrdst, ring allreduce, the counter model with its
calibrated spurious retransmissions) after 250 healthy pulses; per size and rate, the pulses from the
onset to spine2's own alert naming that link, median over seeds, and any false alert.

    python bench/spine_alarm.py                     # 4 and 16 MiB, 1% and 2%, 5 seeds
    python bench/spine_alarm.py --sizes 4 --rates 0.01 --seeds 9

Runtime: about 10 s per seed and cell on one core.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.model import ModelSpec  # noqa: E402
from analysis.modelrun import run_model  # noqa: E402

LINK = "leaf1->spine2"


def pulses_to_own_alarm(size_mib: int, rate: float, seed: int, onset: int, after: int) -> tuple[int | None, int]:
    spec = ModelSpec(spray="rrdst", size=size_mib << 20, seed=seed)
    run = run_model(spec, onset + after, {onset: {"drop": {LINK: rate}}})
    alerts = [a for a in run.alerts if a["event"] == "alert"]
    own = [a for a in alerts if a["switch"] == "spine2" and a["link"] == LINK and a["iteration"] >= onset]
    false = [a for a in alerts if a["iteration"] < onset or (LINK != a["link"] and LINK not in a["candidates"])]
    return (own[0]["iteration"] - onset + 1 if own else None), len(false)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 16], help="collective sizes (MiB)")
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.02])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--onset", type=int, default=250, help="healthy pulses before the fault")
    p.add_argument("--after", type=int, default=40, help="faulty pulses observed")
    args = p.parse_args()
    print(f"{'size':>6} {'rate':>6} {'median pulses':>14}  per seed (None: not within {args.after})  false")
    for size in args.sizes:
        for rate in args.rates:
            got = [pulses_to_own_alarm(size, rate, s, args.onset, args.after) for s in range(args.seeds)]
            delays = [d for d, _ in got]
            done = [d for d in delays if d is not None]
            med = statistics.median(done) if len(done) * 2 > len(delays) else None
            print(f"{size:>4}Mi {rate:>6.2%} {str(med):>14}  {delays}  {sum(f for _, f in got)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
