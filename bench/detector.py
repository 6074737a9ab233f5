#!/usr/bin/env python3
"""Detector throughput: port-pulses judged per second on one core.

Generates pulses of a 32-leaf fabric with 32 or 64 spines (counter model), then
times SwitchDetector.observe for one leaf and one spine over those pulses
(warm-up excluded). A pulse is one training iteration (hundreds of ms to
seconds), so a switch needs its pulse judged in far less than that.

    python bench/detector.py [--spines 64] [--pulses 200]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector import DetectorConfig, SwitchDetector  # noqa: E402
from analysis.model import FabricModel, ModelSpec  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spines", type=int, nargs="+", default=[32, 64])
    p.add_argument("--pulses", type=int, default=200)
    p.add_argument("--max-window", type=int, default=256)
    a = p.parse_args()
    print(f"{'spines':>6} {'switch':8} {'ports':>5} {'cells':>5} {'ms/pulse':>9} {'port-pulses/s':>14}")
    for spines in a.spines:
        spec = FabricSpec(leaves=32, spines=spines, hosts_per_leaf=4)
        model = FabricModel(ModelSpec(fabric=spec, size=int(4.4e9), mss=4096, seed=1))
        pulses = [model.step() for _ in range(a.pulses)]
        fab = Fabric(spec)
        for sw in ("leaf5", "spine3"):
            det = SwitchDetector(fab, sw, DetectorConfig(max_window=a.max_window))
            warm = det.cfg.warmup + 2
            for pcs in pulses[:warm]:
                det.observe(pcs[sw])
            t0 = time.process_time()
            for pcs in pulses[warm:]:
                det.observe(pcs[sw])
            dt = (time.process_time() - t0) / (a.pulses - warm)
            ports = len(fab.ports[sw])
            print(f"{spines:>6} {sw:8} {ports:>5} {len(det.cells):>5} {dt * 1e3:>9.2f} {ports / dt:>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
