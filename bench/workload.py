#!/usr/bin/env python3
"""Workload benchmark: iteration time and bus bandwidth of gloo allreduce (root).

Sizes 1, 4, 16, 64 MiB at N=4 and N=8 ranks, healthy and with a 1% drop on one
leaf-spine link, on the default testbed (rrdst spraying, offloads off, MTU 1500).
Beside each figure: the machine's CPU use during the job (from /proc/stat).

    sudo .venv/bin/python bench/workload.py [--iterations 8] [--sizes 1 4 16 64]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import builder, faults  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402


def cpu_times() -> tuple[int, int]:
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)  # busy, total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64], help="MiB")
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--prefix", default="fpwl")
    a = p.parse_args()
    builder.down(a.prefix)
    tb = builder.up(a.prefix, FabricSpec())
    rows = []
    try:
        for n in a.ranks:
            for mib in a.sizes:
                for fault in (None, "leaf1->spine2:drop=0.01"):
                    if fault:
                        faults.apply(tb, faults.parse_fault(tb.fabric, fault))
                    b0, t0 = cpu_times()
                    res = run_job(tb, JobSpec(size=mib << 20, iterations=a.iterations, idle_ms=100, ranks=n),
                                  Path(tempfile.mkdtemp(prefix="fpwl-")))
                    b1, t1 = cpu_times()
                    if fault:
                        faults.clear(tb)
                    s = res.summary
                    rows.append((n, mib, "1% drop" if fault else "healthy", res.ok, s.get("iteration_s_median"),
                                 s.get("iteration_s_p95"), s.get("busbw_gbps"), 100 * (b1 - b0) / max(t1 - t0, 1),
                                 sum(sum(it["retrans_segs"]) for it in res.iterations) / max(len(res.iterations), 1)))
                    r = rows[-1]
                    print(f"N={n} {mib} MiB {r[2]}: {'ok' if r[3] else 'FAILED'}", file=sys.stderr)
    finally:
        builder.down(a.prefix)
    print(f"{'N':>2} {'MiB':>4} {'link':8} {'ok':3} {'iter ms (med)':>13} {'p95 ms':>7} {'busbw Gb/s':>10} "
          f"{'CPU %':>6} {'retrans/iter':>12}")
    for n, mib, cond, ok, med, p95, bw, cpu, rt in rows:
        print(f"{n:>2} {mib:>4} {cond:8} {'yes' if ok else 'NO':3} {1e3 * (med or 0):>13.1f} {1e3 * (p95 or 0):>7.1f} "
              f"{bw or 0:>10.3f} {cpu:>6.1f} {rt:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
