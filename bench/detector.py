#!/usr/bin/env python3
"""Detector throughput: time to judge one switch-pulse, this detector beside an older one.

Generates pulses of a 32-leaf fabric with 32 or 64 spines (counter model), then
times ``SwitchDetector.observe`` for one leaf and one spine over those pulses,
first pulses excluded. The older detector is loaded from git history
(``--baseline-rev``, default: the last commit with the single-file detector), so
both run on the same pulses in the same process. A pulse is one training
iteration (hundreds of ms to seconds); a switch must judge it in far less.

    python bench/detector.py [--spines 32 64] [--pulses 200] [--baseline-rev REV | --no-baseline]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.detector import DetectorConfig, SwitchDetector  # noqa: E402
from analysis.model import FabricModel, ModelSpec  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec, SprayMode  # noqa: E402

OLD_REV = "494436c"   # last commit whose detector was agent/detector.py (window scan, chi-square bound)


def load_old(rev: str):
    """The single-file detector as it was at ``rev`` (a module object), or None outside a git checkout."""
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:agent/detector.py"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("old_detector")
    mod.__dict__["__name__"] = "old_detector"
    sys.modules["old_detector"] = mod
    exec(compile(src, f"{rev}:agent/detector.py", "exec"), mod.__dict__)
    return mod


def time_it(det, pulses, sw: str, skip: int) -> float:
    for pcs in pulses[:skip]:
        det.observe(pcs[sw])
    t0 = time.process_time()
    for pcs in pulses[skip:]:
        det.observe(pcs[sw])
    return (time.process_time() - t0) / (len(pulses) - skip)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spines", type=int, nargs="+", default=[32, 64])
    p.add_argument("--pulses", type=int, default=200)
    p.add_argument("--baseline-rev", default=OLD_REV, help="git revision of the older detector to time beside")
    p.add_argument("--no-baseline", action="store_true")
    a = p.parse_args()
    old = None if a.no_baseline else load_old(a.baseline_rev)
    if old is None and not a.no_baseline:
        print(f"(older detector at {a.baseline_rev} not found: timing this one only)", file=sys.stderr)
    print(f"{'spines':>6} {'switch':8} {'ports':>5} {'ms/pulse':>9} {'port-pulses/s':>14} "
          f"{'old ms/pulse':>13} {'speed-up':>8}")
    for spines in a.spines:
        spec = FabricSpec(leaves=32, spines=spines, hosts_per_leaf=4)
        model = FabricModel(ModelSpec(fabric=spec, size=int(4.4e9), mss=4096, seed=1))
        pulses = [model.step() for _ in range(a.pulses)]
        fab = Fabric(spec)
        for sw in ("leaf5", "spine3"):
            dt = time_it(SwitchDetector(fab, sw, DetectorConfig(), SprayMode.RRDST), pulses, sw, 14)
            ports = len(fab.ports[sw])
            line = f"{spines:>6} {sw:8} {ports:>5} {dt * 1e3:>9.3f} {ports / dt:>14,.0f}"
            if old is not None:
                dt_old = time_it(old.SwitchDetector(fab, sw, old.DetectorConfig()), pulses, sw, 14)
                line += f" {dt_old * 1e3:>13.3f} {dt_old / dt:>7.1f}x"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
