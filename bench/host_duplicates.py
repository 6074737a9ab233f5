#!/usr/bin/env python3
"""Spurious retransmissions against the host test: each leaf's host ports with and without the hosts'
D-SACKs taken off (root).

Healthy runs of a 4x4x2 testbed (rrdst), --reps per workload: real gloo jobs of --size MiB for
--iterations iterations, every switch's pulses recorded. Printed per workload, over every leaf and
pulse where the host test judges both hosts: the packets one host got beyond its peer (median and
largest |difference|, and how many pulses differ by more than 1% of a host's packets), raw and after
the duplicates each host reported with a D-SACK are taken off; then the host test's alerts when the
runs are replayed with the D-SACK counts and with them removed (as a source that cannot see them).
Every alert here is false: no fault is set.

    sudo .venv/bin/python bench/host_duplicates.py
    sudo .venv/bin/python bench/host_duplicates.py --workloads allreduce --reps 5 --size 8

Runtime: about 40 s a run; the default (4 workloads x 3 reps) about 8 minutes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector import DetectorConfig  # noqa: E402
from agent.detector.checks import TCP_IP_HEADERS  # noqa: E402
from analysis.experiment import run_experiment  # noqa: E402
from analysis.rundir import load_pulses  # noqa: E402
from analysis.replay import run_detectors  # noqa: E402
from analysis.spec import ExperimentSpec  # noqa: E402
from netns_testbed.nsutil import require_root  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec, SprayMode  # noqa: E402
from workload.launcher import JobSpec  # noqa: E402


def host_differences(fabric: Fabric, pulses: dict, corrected: bool) -> list[float]:
    S, H = fabric.spec.spines, fabric.spec.hosts_per_leaf
    mss = fabric.spec.mtu - TCP_IP_HEADERS
    out = []
    for sw, seq in pulses.items():
        if not sw.startswith("leaf"):
            continue
        for pc in seq:
            got = pc.data[S:S + H, 1, :].sum(axis=1).astype(float)
            if corrected and pc.dup is not None:
                got = got - pc.dup[S:S + H, 0, 1] / mss
            if got.min() >= 1000:                # both hosts busy: a pulse the host test judges
                out.append((float(got.max() - got.min()), float(got.min())))
    return out


def host_alerts(fabric: Fabric, pulses: dict, keep_dup: bool) -> int:
    if not keep_dup:
        for seq in pulses.values():
            for pc in seq:
                pc.dup = None
    events, _ = run_detectors(fabric, pulses, DetectorConfig(), SprayMode.RRDST)
    return sum(1 for e in events if e["event"] == "alert" and (e.get("evidence") or {}).get("test") == "host")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[9:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["allreduce", "allgather", "reduce_scatter", "ddp"],
                    choices=["allreduce", "allgather", "reduce_scatter", "ddp"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size", type=int, default=8, help="MiB")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--prefix", default="fpdup")
    args = ap.parse_args()
    require_root()
    fabric_spec = FabricSpec()
    fabric = Fabric(fabric_spec)
    print(f"{'workload':15s} {'pulses':>6s}  {'raw: median':>11s} {'max':>5s} {'>1%':>4s}  "
          f"{'D-SACK off: median':>18s} {'max':>5s} {'>1%':>4s}  {'host alerts raw':>15s} {'with D-SACK':>11s}")
    for wl in args.workloads:
        raw, cor, alerts_raw, alerts_cor = [], [], 0, 0
        for rep in range(args.reps):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run"
                spec = ExperimentSpec(fabric=fabric_spec, job=JobSpec(wl, size=args.size << 20,
                                      iterations=args.iterations, idle_ms=150, seed=rep), prefix=args.prefix)
                rep_json = run_experiment(spec, out, progress=lambda m: None)
                if rep_json.get("workload", {}).get("ok") is False:
                    print(f"{wl} rep {rep}: job failed", file=sys.stderr)
                    continue
                raw += host_differences(fabric, load_pulses(out / "pulses"), False)
                cor += host_differences(fabric, load_pulses(out / "pulses"), True)
                alerts_cor += host_alerts(fabric, load_pulses(out / "pulses"), True)
                alerts_raw += host_alerts(fabric, load_pulses(out / "pulses"), False)
            print(f"  {wl} rep {rep + 1}/{args.reps} done", file=sys.stderr)

        def row(d):
            diffs = [x for x, _ in d]
            over = sum(1 for x, n in d if x > 0.01 * n)
            return f"{statistics.median(diffs):11.1f} {max(diffs):5.0f} {over:4d}" if d else f"{'-':>11s} {'-':>5s} {'-':>4s}"
        print(f"{wl:15s} {len(raw):6d}  {row(raw)}  {row(cor):>24s}  {alerts_raw:15d} {alerts_cor:11d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
