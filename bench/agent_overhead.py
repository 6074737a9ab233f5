#!/usr/bin/env python3
"""Agent CPU and memory per switch on the testbed, idle and during a real gloo job (root).

Builds a default testbed (prefix ``fpbench``), starts one `flowpulse agent`
process per switch, reads each agent's CPU time (/proc/<pid>/stat) over
``--idle-s`` seconds with no traffic, then runs an 8-rank allreduce and reads
CPU time and resident memory (VmRSS, VmHWM) when the job is over.

    sudo .venv/bin/python bench/agent_overhead.py [--iterations 60] [--size 4MiB] [--idle-s 20]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import builder  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def mem_kb(pid: int) -> tuple[int, int]:
    st = dict(l.split(":", 1) for l in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in l)
    return int(st["VmRSS"].split()[0]), int(st["VmHWM"].split()[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--size", type=int, default=4 << 20)
    p.add_argument("--prefix", default="fpbench")
    p.add_argument("--idle-s", type=float, default=20.0, help="seconds of no traffic to measure first")
    a = p.parse_args()
    builder.down(a.prefix)
    tb = builder.up(a.prefix, FabricSpec())
    procs = {}
    try:
        exe = [sys.executable, "-m", "flowpulse", "agent", "--prefix", a.prefix]
        for sw in tb.fabric.switches:
            procs[sw] = subprocess.Popen([*exe, "--switch", sw], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        i0 = {sw: cpu_s(pr.pid) for sw, pr in procs.items()}
        time.sleep(a.idle_s)
        idle = {sw: 100 * (cpu_s(pr.pid) - i0[sw]) / a.idle_s for sw, pr in procs.items()}
        c0 = {sw: cpu_s(pr.pid) for sw, pr in procs.items()}
        t0 = time.time()
        res = run_job(tb, JobSpec(size=a.size, iterations=a.iterations, idle_ms=300), Path(f"/tmp/{a.prefix}-job"))
        wall = time.time() - t0
        rows = []
        for sw, pr in procs.items():
            used = cpu_s(pr.pid) - c0[sw]
            rss, hwm = mem_kb(pr.pid)
            rows.append((sw, idle[sw], used, 100 * used / wall, rss / 1024, hwm / 1024))
    finally:
        for pr in procs.values():
            pr.terminate()
        builder.down(a.prefix)
    print(f"job: {'ok' if res.ok else 'FAILED'}, {a.iterations} iterations of {a.size / 2**20:g} MiB in {wall:.1f} s")
    print(f"{'switch':8} {'idle % of a core':>16} {'job cpu s':>9} {'job % of a core':>15} {'RSS MiB':>8} {'peak MiB':>8}")
    for sw, idle_pct, used, pct, rss, hwm in rows:
        print(f"{sw:8} {idle_pct:>16.2f} {used:>9.2f} {pct:>15.2f} {rss:>8.1f} {hwm:>8.1f}")
    print(f"median: idle {sorted(r[1] for r in rows)[len(rows) // 2]:.2f}% of a core, job "
          f"{sorted(r[3] for r in rows)[len(rows) // 2]:.2f}% per switch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
