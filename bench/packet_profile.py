#!/usr/bin/env python3
"""Where a forwarded packet's CPU time goes, per datapath (root; needs `perf`).

bench/datapath.py says how fast each datapath forwards; bench/program_cost.py times the switch
programs alone. Neither says where the rest of a packet's time goes. This bench builds the datapath
bench's 2x4x1 fabric once per row (FlowPulse on tcx, an empty program on every port, plain kernel
ECMP), sends 64-byte UDP datagrams h0 -> h1 with iperf3 in each, and samples every CPU with
`perf record -a` (the cpu-clock event: it needs no hardware counters, so it works in a VM) for a
few seconds in the middle of the run. Each kernel function's samples over the packets delivered
give its time per packet (ns, over every CPU); the rows are printed side by side, largest
difference from the first row first, so a change of the datapath shows as the functions it added
and the ones it spared the kernel. The sender's CPU carries the whole path (veth delivers within the
sending softirq), so the sum of a row is what bounds its rate.

    sudo .venv/bin/python bench/packet_profile.py [--seconds 3] [--rounds 3] [--top 25]

The figures are medians over the rounds (rows alternate within a round). Samples land where
interrupts are enabled again, so time spent with them off shows on the function that re-enables
them (often _raw_spin_unlock_irqrestore under the receiver's wake-up): read differences, not
absolute attributions.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from datapath import attach_noop  # noqa: E402

from netns_testbed import builder, faults  # noqa: E402
from netns_testbed.bpfmaps import tcx_supported  # noqa: E402
from netns_testbed.hooks import Hook  # noqa: E402
from netns_testbed.nsutil import netns_argv  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402

ROWS = {"fpqs": "FlowPulse (spray+count+fault)", "fpqn": "empty program", "fpqo": "kernel ECMP, no BPF"}
PROG = re.compile(r"bpf_prog_[0-9a-f]+_")
IDLE = re.compile(r"halt|idle|mwait")     # a CPU waiting for work (pv_native_safe_halt, call_cpuidle, ...)


def udp_run(tb, seconds: float, data: Path) -> tuple[float, dict[str, float]]:
    """(datagrams per second delivered, {function: samples' ns}) of one UDP run sampled by perf."""
    server = subprocess.Popen(netns_argv(tb.ns("h1"), ["iperf3", "-s", "-1", "-p", "5201"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    client = subprocess.Popen(netns_argv(tb.ns("h0"), ["iperf3", "-c", tb.fabric.host_ip("h1"), "-p", "5201",
                                                        "-t", str(seconds + 2), "-J", "-u", "-b", "0", "-l", "64"]),
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        subprocess.run(["perf", "record", "-a", "-q", "-o", str(data), "--", "sleep", str(seconds)],
                       check=True, capture_output=True)
        out, _ = client.communicate(timeout=seconds + 30)
    finally:
        client.kill()
        server.kill()
        server.wait()
    u = json.loads(out)["end"]["sum"]
    pps = (u["packets"] - u["lost_packets"]) / u["seconds"]
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "sym"],
                         capture_output=True, text=True, check=True).stdout
    total = float(re.search(r"Event count \(approx.\): (\d+)", rep).group(1))   # ns over every CPU
    ns: dict[str, float] = {}
    for line in rep.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+\[.\]\s+(\S+)", line)
        if m:
            name = PROG.sub("bpf_prog_", m.group(2))
            ns[name] = ns.get(name, 0.0) + float(m.group(1)) / 100 * total
    return pps, {k: v / (pps * seconds) for k, v in ns.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3, help="sampled seconds per run (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="runs per row, alternated (default 3)")
    p.add_argument("--top", type=int, default=25, help="functions shown (default 25)")
    a = p.parse_args()
    if a.seconds <= 0 or a.rounds < 1 or a.top < 1:
        print("packet_profile: --seconds must be > 0, --rounds and --top >= 1", file=sys.stderr)
        return 2
    if not shutil.which("perf") or not shutil.which("iperf3"):
        print("packet_profile: needs perf and iperf3 (apt install iperf3 and linux-perf on Debian, linux-tools-$(uname -r) on Ubuntu)", file=sys.stderr)
        return 3
    hook = Hook.TCX if tcx_supported() else Hook.CLSACT
    opts = {"fpqs": builder.UpOptions(hook=hook), "fpqn": builder.UpOptions(datapath=False),
            "fpqo": builder.UpOptions(datapath=False)}
    for pre in ROWS:
        builder.down(pre)
    links: list[int] = []
    shape = FabricSpec(leaves=2, spines=4, hosts_per_leaf=1)
    runs: dict[str, list] = {pre: [] for pre in ROWS}
    try:
        beds = {pre: builder.up(pre, shape, opts[pre]) for pre in ROWS}
        faults.apply(beds["fpqs"], faults.parse_fault(beds["fpqs"].fabric, "leaf0->spine1:drop=0"))
        links += attach_noop(beds["fpqn"], hook)
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(a.rounds):
                for pre, tb in beds.items():
                    runs[pre].append(udp_run(tb, a.seconds, Path(tmp) / f"{pre}.data"))
                    print(f"round {r + 1}/{a.rounds}: {ROWS[pre]} {runs[pre][-1][0] / 1e3:.1f} kpps",
                          file=sys.stderr, flush=True)
    finally:
        for fd in links:
            os.close(fd)
        for pre in ROWS:
            builder.down(pre)
    rate = {pre: statistics.median(pps for pps, _ in v) for pre, v in runs.items()}
    names = sorted({k for v in runs.values() for _, d in v for k in d})
    per = {pre: {k: statistics.median(d.get(k, 0.0) for _, d in v) for k in names} for pre, v in runs.items()}
    first, *others = ROWS
    print(f"64-byte UDP h0 -> h1 over 2x4x1, {hook.label}; median of {a.rounds} runs; ns per delivered datagram, "
          "summed over every CPU (perf cpu-clock samples)")
    print(f"{'':36}" + "".join(f"{ROWS[pre]:>31}" for pre in ROWS))
    print(f"{'datagrams per second (k)':36}" + "".join(f"{rate[pre] / 1e3:>31.1f}" for pre in ROWS))
    busy = {pre: sum(v for k, v in per[pre].items() if not IDLE.search(k)) for pre in ROWS}
    print(f"{'every function but idle':36}" + "".join(f"{busy[pre]:>31.0f}" for pre in ROWS))
    key = lambda k: -max(abs(per[first][k] - per[o][k]) for o in others)   # noqa: E731
    for k in sorted((k for k in names if not IDLE.search(k)), key=key)[:a.top]:
        print(f"{k[:36]:36}" + "".join(f"{per[pre][k]:>31.0f}" for pre in ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
