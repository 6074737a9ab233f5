#!/usr/bin/env python3
"""Datapath cost and testbed footprint (root).

1. Forwarding through the fabric, testbeds side by side in one run,
   measured alternately: FlowPulse programs attached with spraying (rrdst) +
   counting + a rate-0 fault on the path (every stage runs); the programs
   attached with spraying off (kernel ECMP picks the uplink); an empty program
   (bench/noop.c) on every port, i.e. the cost of the hooks alone; plain
   kernel ECMP with no BPF. Where the kernel has tcx links (6.6+), the
   FlowPulse and the empty-program rows are measured with each hook, tcx and
   tc clsact. TCP goodput (iperf3, 1 and 4 streams) and small-packet UDP rate
   (64-byte datagrams), as ratios to plain ECMP (targets: 0.95 TCP, 0.90 UDP). Spraying also
   costs TCP some goodput through reordering, which the middle row separates.
   Each round measures every row once, in an order drawn per round (--seed): no row is always first
   or last. A row's ratio is the median over the rounds of the row against kernel ECMP in the same
   round; beside it, the spread of those per-round ratios (min-max), i.e. what the bench can tell.
   --cpus A,B pins iperf3's client to CPU A and its server to CPU B (a veth hands a packet on in the
   sender's softirq, so the forwarding and the programs run on A); by default the scheduler places
   them. On a 2-CPU machine pinning did not narrow the spread (docs/results/cost.md).
2. `up`/`down` wall time and memory (MemAvailable drop, builder peak RSS) for the
   default fabric and larger ones.

    sudo .venv/bin/python bench/datapath.py [--seconds 5] [--reps 3] [--cpus 0,1] [--shapes 4x4x2 8x8x2 12x12x2]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import builder, faults, hooks  # noqa: E402
from netns_testbed.bpfmaps import tcx_supported  # noqa: E402
from netns_testbed.hooks import Hook  # noqa: E402
from netns_testbed.nsutil import in_netns, iproute, netns_argv  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402


def pinned(cpu: int | None, argv: list[str]) -> list[str]:
    return argv if cpu is None else ["taskset", "-c", str(cpu), *argv]


def iperf(tb, src: str, dst: str, seconds: float, extra: list[str], cpus: tuple[int, int] | None = None) -> dict:
    client_cpu, server_cpu = cpus or (None, None)
    server = subprocess.Popen(pinned(server_cpu, netns_argv(tb.ns(dst), ["iperf3", "-s", "-1", "-p", "5201"])),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        r = subprocess.run(pinned(client_cpu, netns_argv(tb.ns(src), ["iperf3", "-c", tb.fabric.host_ip(dst), "-p",
                                                                      "5201", "-t", str(seconds), "-J", *extra])),
                           capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(r.stdout)["end"]
    finally:
        server.kill()
        server.wait()


def measure(tb, seconds: float, cpus: tuple[int, int] | None) -> dict:
    """h0 (leaf0) -> h1 (leaf1) across the spines of a 2x4x1 fabric."""
    tcp1 = iperf(tb, "h0", "h1", seconds, [], cpus)["sum_received"]["bits_per_second"] / 1e9
    tcp4 = iperf(tb, "h0", "h1", seconds, ["-P", "4"], cpus)["sum_received"]["bits_per_second"] / 1e9
    udp = iperf(tb, "h0", "h1", seconds, ["-u", "-b", "0", "-l", "64"], cpus)["sum"]
    return {"tcp1_gbps": tcp1, "tcp4_gbps": tcp4,
            "udp64_kpps": (udp["packets"] - udp["lost_packets"]) / udp["seconds"] / 1e3}


def _used_kib() -> int:
    """Kernel + user memory in use (MemTotal - MemAvailable), after dropping page cache noise."""
    info = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/meminfo")}
    return info["MemTotal"] - info["MemAvailable"]


def attach_noop(tb, hook: Hook) -> list[int]:
    """The empty program on both directions of every switch port (the hooks' own cost); returns the
    tcx links' descriptors (held until the testbed goes)."""
    from netns_testbed.datapath import load_bcc

    BPF = load_bcc()
    b = BPF(src_file=str(Path(__file__).with_name("noop.c")).encode())
    fn = b.load_func(b"noop", BPF.SCHED_CLS)
    links = []
    for sw in tb.fabric.switches:
        with iproute(tb.ns(sw)) as ipr, in_netns(tb.ns(sw)):
            for port in tb.fabric.ports[sw]:
                idx = ipr.link_lookup(ifname=port.ifname)[0]
                if hook is Hook.TCX:
                    links += [hooks.attach_tcx(fn.fd, idx, d) for d in hooks.DIRECTIONS]
                else:
                    hooks.attach_clsact(ipr, idx, {d: (fn.fd, fn.name) for d in hooks.DIRECTIONS})
    b.cleanup()
    return links


def footprint(shape: str) -> dict:
    l, s, h = (int(x) for x in shape.split("x"))
    prefix = "fpfoot"
    builder.down(prefix)
    time.sleep(2)
    m0 = min(_used_kib() for _ in range(3))
    t0 = time.time()
    builder.up(prefix, FabricSpec(l, s, h))
    t_up = time.time() - t0
    time.sleep(2)
    m1 = min(_used_kib() for _ in range(3))
    t0 = time.time()
    builder.down(prefix)
    t_down = time.time() - t0
    return {"shape": shape, "namespaces": l + s + l * h, "up_s": round(t_up, 1), "down_s": round(t_down, 1),
            "kernel_mem_mib": round((m1 - m0) / 1024, 1),
            "builder_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--shapes", nargs="*", default=["4x4x2", "8x8x2", "16x16x2"],
                   help="fabrics for the up/down footprint (none: skip it)")
    p.add_argument("--cpus", default="none",
                   help="A,B: iperf3's client on CPU A, its server on CPU B; none (default): the scheduler's")
    p.add_argument("--seed", type=int, default=1, help="draws each round's order of the rows")
    a = p.parse_args()
    cpus = None
    if a.cpus != "none":
        try:
            cpus = tuple(int(x) for x in a.cpus.split(","))
            if len(cpus) != 2 or not all(0 <= c < (os.cpu_count() or 1) for c in cpus):
                raise ValueError
        except ValueError:
            p.error(f"--cpus {a.cpus}: two CPU numbers below {os.cpu_count()} as A,B, or none")
    if a.reps < 1 or a.seconds <= 0:
        p.error("--reps at least 1, --seconds above 0")
    shape = FabricSpec(leaves=2, spines=4, hosts_per_leaf=1)
    kinds = [Hook.TCX, Hook.CLSACT] if tcx_supported() else [Hook.CLSACT]
    names, opts = {}, {}     # prefix -> row label, build options
    for h in kinds:
        names[f"fpbs{h.value[0]}"] = f"spray+count+fault, {h.label}"
        opts[f"fpbs{h.value[0]}"] = builder.UpOptions(hook=h)
    names["fpbcount"] = f"count+fault only, {kinds[0].label}"
    opts["fpbcount"] = builder.UpOptions(hook=kinds[0])
    for h in kinds:
        names[f"fpbn{h.value[0]}"] = f"empty program, {h.label}"
        opts[f"fpbn{h.value[0]}"] = builder.UpOptions(datapath=False)
    names["fpboff"] = "kernel ECMP, no BPF"
    opts["fpboff"] = builder.UpOptions(datapath=False)
    for pre in names:
        builder.down(pre)
    beds = {pre: builder.up(pre, shape, opts[pre]) for pre in names}
    links: list[int] = []
    try:
        for pre in names:    # a rate-0 fault on the path: the fault stage runs too
            if pre.startswith(("fpbs", "fpbcount")):
                faults.apply(beds[pre], faults.parse_fault(beds[pre].fabric, "leaf0->spine1:drop=0"))
        for h in kinds:
            links += attach_noop(beds[f"fpbn{h.value[0]}"], h)
        for leaf in beds["fpbcount"].fabric.leaves:  # programs attached, spraying off: kernel ECMP picks
            m = beds["fpbcount"].maps(leaf)
            m.set_config(None, beds["fpbcount"].state.gap_ms)   # spraying off: the kernel routes
            m.close()
        res: dict[str, list] = {k: [] for k in names}
        rng = random.Random(a.seed)
        for r in range(a.reps):
            order = list(beds)
            rng.shuffle(order)
            print(f"round {r + 1}/{a.reps}", file=sys.stderr, flush=True)
            for pre in order:
                res[pre].append(measure(beds[pre], a.seconds, cpus))
    finally:
        for fd in links:
            os.close(fd)
        for pre in names:
            builder.down(pre)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in res.items()}
    # each round measures every row within a minute or so: a row's ratio to kernel ECMP is taken within
    # its round (the machine's slow drift cancels), then the median over the rounds
    per_round = {k: {m: [r[m] / b[m] for r, b in zip(v, res["fpboff"])] for m in v[0]} for k, v in res.items()}
    ratio = {k: {m: statistics.median(xs) for m, xs in v.items()} for k, v in per_round.items()}
    print(f"median of {a.reps} runs of {a.seconds:g} s, h0 (leaf0) -> h1 (leaf1) over 4 spines, iperf3 "
          f"{'client on CPU %d, server on CPU %d' % cpus if cpus else 'unpinned'}; (ratio = median over the rounds "
          "of the row / kernel ECMP in the same round, and its min-max over the rounds)")
    print(f"{'datapath':32} {'TCP 1 flow Gb/s':>24} {'TCP 4 flows Gb/s':>24} {'UDP 64 B kpps':>24}")

    def cell(pre: str, m: str, fmt: str) -> str:
        xs = per_round[pre][m]
        return f"{format(med[pre][m], fmt):>7} ({ratio[pre][m]:.2f} {min(xs):.2f}-{max(xs):.2f})"

    for pre, label in names.items():
        print(f"{label:32} {cell(pre, 'tcp1_gbps', '.2f'):>24} {cell(pre, 'tcp4_gbps', '.2f'):>24} "
              f"{cell(pre, 'udp64_kpps', '.1f'):>24}")
    if not a.shapes:
        return 0
    print()
    print(f"{'shape':8} {'namespaces':>10} {'up s':>6} {'down s':>6} {'kernel MiB':>10} {'builder peak MiB':>16}")
    for shape in a.shapes:
        f = footprint(shape)
        print(f"{f['shape']:8} {f['namespaces']:>10} {f['up_s']:>6} {f['down_s']:>6} {f['kernel_mem_mib']:>10} "
              f"{f['builder_peak_rss_mib']:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
