#!/usr/bin/env python3
"""How often iteration tails move between pulses, on recorded runs: what the host test's tail rules
(``HOST_REPAYS``, ``HOST_SHORT`` in agent/detector/checks.py) see.

For each run directory (default: every run shipped in tests/data/recorded-runs/) and each leaf, the
pulses are put together as the detector does (PulseAssembler) and, over the pulses where at least two
hosts are active: how many have two hosts more than 1% apart (after the hosts' D-SACKed segments are
taken off), how many have a mean per active host more than 0.5%, 1% and 2% below one iteration's (the
HOST_REFERENCE quantile of the last HOST_HISTORY pulses', as the detector takes it: the pulses HOST_SHORT
leaves unjudged at its 1%), and how many are more than 25% above it (parts of two iterations or more in
one pulse, which that quantile is chosen to withstand). No root, no testbed.

    .venv/bin/python bench/host_tails.py
    .venv/bin/python bench/host_tails.py /tmp/pytest-of-root/pytest-*/test_each_workload_localizes_a*

Runtime: a few seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector import DetectorConfig  # noqa: E402
from agent.detector.checks import (HOST_HISTORY, HOST_REFERENCE, TCP_IP_HEADERS, busy_hosts,  # noqa: E402
                                   host_delivered)
from agent.pulse import PulseAssembler  # noqa: E402
from analysis.rundir import load_pulses  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec  # noqa: E402

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "recorded-runs"


def tails(run: Path, cfg: DetectorConfig) -> dict:
    spec = json.loads((run / "report.json").read_text())["spec"]
    fabric = Fabric(FabricSpec.from_dict(spec["fabric"]))
    S, H = fabric.spec.spines, fabric.spec.hosts_per_leaf
    mss = float(fabric.spec.mtu - TCP_IP_HEADERS)
    judged = apart = 0
    short = {0.005: 0, 0.01: 0, 0.02: 0}
    merged = 0
    for sw, seq in load_pulses(run / "pulses").items():
        if not sw.startswith("leaf"):
            continue
        asm = PulseAssembler(cfg.fragment_share, cfg.min_pulse_pkts)
        history: deque[float] = deque(maxlen=HOST_HISTORY)
        for raw in seq:
            pc = asm.push(raw)
            if pc is None or pc.total < cfg.min_pulse_pkts:
                continue
            obs = host_delivered(pc, S, H, mss)
            active = busy_hosts(obs, cfg.min_cell_pkts)
            if active.sum() < 2:
                continue
            judged += 1
            a = obs[active]
            apart += bool(a.max() - a.min() > 0.01 * a.min())
            mean = float(a.mean())
            if len(history) >= 3:
                usual = float(np.quantile(history, HOST_REFERENCE))
                for k in short:
                    short[k] += mean < (1 - k) * usual
                merged += mean > 1.25 * usual
            history.append(mean)
    return {"run": run.name, "workload": spec["workload"]["workload"], "pulses": judged, "apart_1pct": apart,
            **{f"short_{k:g}": v for k, v in short.items()}, "merged": merged}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("runs", nargs="*", type=Path, help="run directories (report.json and pulses/)")
    ap.add_argument("--json", action="store_true", help="one JSON object per run on stdout")
    args = ap.parse_args()
    runs = args.runs or sorted(p for p in RUNS.iterdir() if (p / "report.json").exists())
    rows = [tails(r, DetectorConfig()) for r in runs]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print(f"{'run':36s} {'workload':15s} {'pulses':>6s} {'apart>1%':>9s} {'short>0.5%':>10s} {'>1%':>5s} {'>2%':>5s} {'long>25%':>8s}")
    for r in rows:
        n = max(r["pulses"], 1)
        print(f"{r['run']:36s} {r['workload']:15s} {r['pulses']:6d} {r['apart_1pct'] / n:9.1%} "
              f"{r['short_0.005'] / n:10.1%} {r['short_0.01'] / n:5.1%} {r['short_0.02'] / n:5.1%} {r['merged'] / n:8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
