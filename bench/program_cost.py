#!/usr/bin/env python3
"""What the switch program costs per packet, measured in the kernel without a fabric (root).

The program (bpf/switch.c, compiled as the testbed compiles it, for a leaf and a spine of the
datapath bench's 2x4x1 fabric) runs on crafted frames with BPF_PROG_TEST_RUN, many times on one
buffer; the kernel times the runs itself. An empty program (bench/noop.c) run the same way gives the
test harness's own cost, subtracted. The maps are set as `fabric up` sets them, with rrdst spraying
and a rate-0 fault on the leaf's uplink 1 (every stage runs, as in bench/datapath.py's first row).

The runs happen in a network namespace of the bench's own, forwarding on, with a route to each
leaf's hosts through a resolved next hop: the programs' FIB lookups find a route, as in a fabric.

Each row is one program run; "path" is what one packet costs in programs over its six runs: from
h0 to h1 (leaf0 in and out, a spine in and out, leaf1 in and out), and for the ACK back. With --against REV the program of that git revision
(its netns_testbed/bpf/) is measured beside the working tree's, alternated round by round, so that
one change of the C source is judged by numbers from the same minutes. This is the precise side of
bench/datapath.py, whose throughput rows also carry the hooks' cost and the machine's noise.

    sudo .venv/bin/python bench/program_cost.py [--rounds 7] [--repeat 200000] [--against HEAD~1]
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes as ct
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bcc.table import HashTable               # noqa: E402
from scapy.layers.inet import IP, TCP, UDP      # noqa: E402
from scapy.layers.l2 import Ether               # noqa: E402
from scapy.packet import Raw                    # noqa: E402

from netns_testbed import datapath as dp, faults  # noqa: E402
from netns_testbed.bpfmaps import MapSpec, map_create, prog_test_time  # noqa: E402
from netns_testbed.nsutil import private_netns  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec, SprayMode  # noqa: E402

FABRIC = Fabric(FabricSpec(leaves=2, spines=4, hosts_per_leaf=1))
H0, H1 = FABRIC.host_ip("h0"), FABRIC.host_ip("h1")
MACS = {"src": "02:00:00:00:00:0a", "dst": "02:00:00:00:00:0b"}
TS = [("NOP", None), ("NOP", None), ("Timestamp", (123456, 654321))]
FRAMES = {   # what a TCP bulk transfer and the UDP bench send, as Linux sends them
    "TCP data 1448 B": Ether(**MACS) / IP(src=H0, dst=H1, ttl=255) / TCP(sport=40000, dport=5201, flags="PA", options=TS)
    / Raw(b"x" * 1448),
    "TCP ACK": Ether(**MACS) / IP(src=H1, dst=H0, ttl=255) / TCP(sport=5201, dport=40000, flags="A", options=TS),
    "UDP 64 B": Ether(**MACS) / IP(src=H0, dst=H1, ttl=255) / UDP(sport=40000, dport=5201) / Raw(b"x" * 36),
}


def hops(src: tuple[str, str], dst: tuple[str, str], spine: str = "spine1") -> list[tuple[str, str, int]]:
    """(switch, hook, port) of the six program runs from host src[1] under leaf src[0] to host dst[1]
    under leaf dst[0] through ``spine``."""
    (la, ha), (lb, hb) = src, dst
    port = lambda a, b: FABRIC.port_to(a, b).index   # noqa: E731
    return [(la, "ingress", port(la, ha)), (la, "egress", port(la, spine)),
            (spine, "ingress", port(spine, la)), (spine, "egress", port(spine, lb)),
            (lb, "ingress", port(lb, spine)), (lb, "egress", port(lb, hb))]


PATH, BACK = hops(("leaf0", "h0"), ("leaf1", "h1")), hops(("leaf1", "h1"), ("leaf0", "h0"))   # the ACKs come back
PATHS = {"TCP data 1448 B": PATH, "TCP ACK": BACK, "UDP 64 B": PATH}


class Variant:
    """One source of the switch program, compiled for the path's three switches, maps set up."""

    def __init__(self, label: str, bpf_dir: Path, contract: bool = True) -> None:
        """``contract``: compile the Python mirrors' assertions in (not for another revision, whose
        header this tree's mirrors need not match; they cost nothing at run time)."""
        self.label = label
        self.switches = {}
        for sw in ("leaf0", "spine1", "leaf1"):
            shape = dp.SwitchShape.of(FABRIC, sw)
            text = dp.source_text(bpf_dir / "switch.c") + "\n" + (dp.contract_asserts(shape) if contract else "")
            cflags = [f"-I{bpf_dir}", *shape.cflags()[1:]]
            b, fns = dp.compile_program(text, cflags, dp.SWITCH_FUNCTIONS)
            maps = dp.SwitchMaps.of_program(FABRIC, sw, _Prog(b, shape))
            if _has_map(b, "port_ifindex"):    # a revision before port_out: redirect targets only
                for port in range(maps.nports):
                    b[b"port_ifindex"][ct.c_int(port)] = ct.c_uint32(100 + port)
            else:                              # redirect targets (a test run redirects nowhere)
                maps.set_ports([100 + port for port in range(maps.nports)])
            maps.set_config(SprayMode.RRDST, 1000.0)
            maps.set_spray({}, [])
            if sw == "leaf0":
                spec = faults.parse_fault(FABRIC, "leaf0->spine1:drop=0")
                site = FABRIC.fault_site(spec.link)
                maps.set_fault(site.port, site.hook, faults.kernel_record(spec))
            self.switches[sw] = (b, fns, maps)

    def run(self, sw: str, hook: str, port: int, frame: bytes, repeat: int) -> float:
        b, fns, maps = self.switches[sw]
        table = b[b"ifindex_port"]     # the test run's device, the loopback, is this port:
        hashed = isinstance(table, HashTable)   # before the array (port + 1), a hash (port)
        table[table.Key(1)] = table.Leaf(port if hashed else port + 1)
        return prog_test_run_ns(fns[f"fp_{hook}"].fd, frame, repeat)


class _Prog:
    """The bits of dp.SwitchProgram that SwitchMaps.of_program reads, from a BCC object."""

    def __init__(self, b, shape: dp.SwitchShape) -> None:
        self.b, self.shape = b, shape

    def map_fd(self, name: str) -> int:
        if not _has_map(self.b, name):       # a map of this tree that an older revision had not: a spare
            value, entries, _ = dp.map_entries(self.shape)[name]
            return map_create(MapSpec(BPF_MAP_TYPE_ARRAY, 4, ct.sizeof(value), entries, 0, b""))
        return self.b[name.encode()].map_fd


BPF_MAP_TYPE_ARRAY = 2


def _has_map(b, name: str) -> bool:
    try:
        b[name.encode()]
    except KeyError:
        return False
    return True


CHUNK = 200   # runs per buffer: a forwarded packet loses a hop of TTL per run (the frames start at 255)


def prog_test_run_ns(fd: int, frame: bytes, repeat: int) -> float:
    """Mean kernel time of one run (ns), as BPF_PROG_TEST_RUN measures it, over ``repeat`` runs in
    chunks of CHUNK on a fresh copy of the frame."""
    chunks = max(1, repeat // CHUNK)
    return sum(prog_test_time(fd, frame, CHUNK) for _ in range(chunks)) / chunks


@contextlib.contextmanager
def routed_namespace():
    """This thread in a namespace of its own with forwarding on and a route to every leaf's hosts
    through a resolved next hop on a veth (freed with the namespace when the block ends)."""
    from pyroute2 import IPRoute

    with private_netns():
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            ipr.link("add", ifname="pc0", kind="veth", peer="pc1")
            out = ipr.link_lookup(ifname="pc0")[0]
            for idx in (out, *ipr.link_lookup(ifname="pc1")):
                ipr.link("set", index=idx, state="up")
            ipr.addr("add", index=out, address="192.0.2.1", prefixlen=24)
            ipr.neigh("add", dst="192.0.2.2", lladdr="02:00:00:00:00:02", ifindex=out, state=0x80)  # permanent
            for leaf in FABRIC.leaves:
                ipr.route("add", dst=str(Fabric.leaf_subnet(leaf)), gateway="192.0.2.2")
        with open("/proc/sys/net/ipv4/conf/all/forwarding", "w") as f:     # this namespace's
            f.write("1")
        yield


def checkout_bpf(rev: str, into: Path) -> Path:
    """netns_testbed/bpf/ of git revision ``rev``, written under ``into``."""
    root = Path(__file__).resolve().parent.parent
    tar = subprocess.run(["git", "-C", str(root), "archive", rev, "netns_testbed/bpf"], capture_output=True)
    if tar.returncode:
        sys.exit(f"program_cost: git archive {rev} failed: {tar.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    return into / "netns_testbed" / "bpf"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="rounds, each timing every row once (median shown)")
    p.add_argument("--repeat", type=int, default=200000, help="runs per timing")
    p.add_argument("--against", metavar="REV", help="also measure the program of this git revision")
    a = p.parse_args()
    if a.rounds < 1 or a.repeat < 1:
        print("program_cost: --rounds and --repeat must be at least 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        variants = [Variant("working tree", dp.BPF_DIR)]
        if a.against:
            variants.append(Variant(a.against, checkout_bpf(a.against, Path(tmp)), contract=False))
    from netns_testbed.datapath import load_bcc
    BPF = load_bcc()
    noop = BPF(src_file=str(Path(__file__).with_name("noop.c")).encode())
    noop_fd = noop.load_func(b"noop", BPF.SCHED_CLS).fd
    rows = [(fname, sw, hook, port) for fname in FRAMES for sw, hook, port in PATHS[fname]]
    times: dict = {}
    with routed_namespace():
        measure(a, variants, noop_fd, times)
    report(a, variants, rows, times)
    return 0


def measure(a, variants: list[Variant], noop_fd: int, times: dict) -> None:
    for r in range(a.rounds):
        print(f"program_cost: round {r + 1} of {a.rounds}", file=sys.stderr)
        for fname, frame in FRAMES.items():
            raw = bytes(frame)
            times.setdefault(("noop", fname), []).append(prog_test_run_ns(noop_fd, raw, a.repeat))
            for v in variants:
                for sw, hook, port in PATHS[fname]:
                    times.setdefault((v.label, fname, sw, hook), []).append(v.run(sw, hook, port, raw, a.repeat))


def report(a, variants: list[Variant], rows: list, times: dict) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    harness = ", ".join(f"{f}: {med['noop', f]:.0f} ns" for f in FRAMES)
    print(f"ns per program run, median of {a.rounds} rounds of {a.repeat} runs, the empty program's time "
          f"subtracted ({harness})")
    head = f"{'frame':16} {'switch':7} {'hook':8}" + "".join(f" {v.label:>14}" for v in variants)
    print(head)
    for fname, sw, hook, port in rows:
        print(f"{fname:16} {sw:7} {hook:8}" + "".join(
            f" {med[v.label, fname, sw, hook] - med['noop', fname]:>14.1f}" for v in variants))
    for fname in FRAMES:
        print(f"{fname:16} {'path':7} {'(6 runs)':8}" + "".join(
            f" {sum(med[v.label, fname, sw, hook] - med['noop', fname] for sw, hook, _ in PATHS[fname]):>14.1f}"
            for v in variants))


if __name__ == "__main__":
    sys.exit(main())
