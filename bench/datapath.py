#!/usr/bin/env python3
"""Datapath cost and testbed footprint (root).

1. Forwarding through the fabric with the FlowPulse programs attached (spraying
   rrdst + counting + a rate-0 fault on the path, so every stage runs) versus
   plain kernel ECMP forwarding (no BPF), two testbeds side by side in one run,
   measured alternately: TCP goodput (iperf3, 1 and 4 streams) and small-packet
   UDP rate (64-byte datagrams). Reported as ratios (target >= 0.9).
2. `up`/`down` wall time and memory (MemAvailable drop, builder peak RSS) for the
   default fabric and larger ones.

    sudo .venv/bin/python bench/datapath.py [--seconds 5] [--reps 3] [--shapes 4x4x2 8x8x2 12x12x2]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import builder, faults  # noqa: E402
from netns_testbed.nsutil import netns_argv  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402


def iperf(tb, src: str, dst: str, seconds: float, extra: list[str]) -> dict:
    server = subprocess.Popen(netns_argv(tb.ns(dst), ["iperf3", "-s", "-1", "-p", "5201"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        r = subprocess.run(netns_argv(tb.ns(src), ["iperf3", "-c", tb.fabric.host_ip(dst), "-p", "5201", "-t",
                                                   str(seconds), "-J", *extra]),
                           capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(r.stdout)["end"]
    finally:
        server.kill()
        server.wait()


def measure(tb, seconds: float) -> dict:
    """h0 (leaf0) -> h1 (leaf1) across the spines of a 2x4x1 fabric."""
    tcp1 = iperf(tb, "h0", "h1", seconds, [])["sum_received"]["bits_per_second"] / 1e9
    tcp4 = iperf(tb, "h0", "h1", seconds, ["-P", "4"])["sum_received"]["bits_per_second"] / 1e9
    udp = iperf(tb, "h0", "h1", seconds, ["-u", "-b", "0", "-l", "64"])["sum"]
    return {"tcp1_gbps": tcp1, "tcp4_gbps": tcp4,
            "udp64_kpps": (udp["packets"] - udp["lost_packets"]) / udp["seconds"] / 1e3}


def footprint(shape: str) -> dict:
    l, s, h = (int(x) for x in shape.split("x"))
    prefix = "fpfoot"
    builder.down(prefix)
    avail = lambda: int(next(x for x in open("/proc/meminfo") if x.startswith("MemAvailable")).split()[1])  # noqa: E731
    m0 = avail()
    t0 = time.time()
    builder.up(prefix, FabricSpec(l, s, h))
    t_up = time.time() - t0
    time.sleep(1)
    m1 = avail()
    t0 = time.time()
    builder.down(prefix)
    t_down = time.time() - t0
    return {"shape": shape, "namespaces": l + s + l * h, "up_s": round(t_up, 1), "down_s": round(t_down, 1),
            "kernel_mem_mib": round((m0 - m1) / 1024, 1),
            "builder_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--shapes", nargs="+", default=["4x4x2", "8x8x2", "12x12x2"])
    a = p.parse_args()
    for pre in ("fpbon", "fpboff"):
        builder.down(pre)
    on = builder.up("fpbon", FabricSpec(leaves=2, spines=4, hosts_per_leaf=1))
    off = builder.up("fpboff", FabricSpec(leaves=2, spines=4, hosts_per_leaf=1), builder.UpOptions(datapath=False))
    try:
        faults.apply(on, faults.parse_fault(on.fabric, "leaf0->spine1:drop=0"))
        res = {"flowpulse": [], "kernel_ecmp": []}
        for _ in range(a.reps):
            for name, tb in (("flowpulse", on), ("kernel_ecmp", off)):
                res[name].append(measure(tb, a.seconds))
    finally:
        builder.down("fpbon")
        builder.down("fpboff")
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in res.items()}
    print(f"{'metric':14} {'FlowPulse':>10} {'kernel ECMP':>12} {'ratio':>6}   (median of {a.reps}, {a.seconds:g} s each)")
    for m in med["flowpulse"]:
        print(f"{m:14} {med['flowpulse'][m]:>10.3f} {med['kernel_ecmp'][m]:>12.3f} {med['flowpulse'][m] / med['kernel_ecmp'][m]:>6.2f}")
    print()
    print(f"{'shape':8} {'namespaces':>10} {'up s':>6} {'down s':>6} {'kernel MiB':>10} {'builder peak MiB':>16}")
    for shape in a.shapes:
        f = footprint(shape)
        print(f"{f['shape']:8} {f['namespaces']:>10} {f['up_s']:>6} {f['down_s']:>6} {f['kernel_mem_mib']:>10} "
              f"{f['builder_peak_rss_mib']:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
