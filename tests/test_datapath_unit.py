"""The switch program's logic, below a whole fabric: bpf/switch.c compiled for one leaf and one
spine of a 3x4x2 fabric and run in the kernel on scapy-crafted frames with BPF_PROG_TEST_RUN
(nothing attached, no namespace built). Each test sets the maps as the loader does, runs frames
through ``fp_ingress``/``fp_egress`` as if they came in or went out on a given port, and reads the
verdict, the frame the program left and the maps.

What is checked: packet kinds and source classes, the spray choice per mode and weight, ports out
of service, D-SACK counting, drop / corruption / partial / flap decisions with their statistics,
and pulse boundaries. Random decisions are checked against binomial or chi-square bounds whose
chance of failing a correct program is stated at each test (at most 1e-6).
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scipy import stats

from netns_testbed import datapath as dp
from netns_testbed import faults
from netns_testbed.bpfmaps import prog_test_run
from netns_testbed.nsutil import private_netns
from netns_testbed.topo import Fabric, FabricSpec, Link, SprayMode

pytestmark = pytest.mark.root

FABRIC = Fabric(FabricSpec(leaves=3, spines=4, hosts_per_leaf=2))
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT, TC_ACT_UNSPEC = 0, 2, 7, -1
H0, H1, H2, H4 = (FABRIC.host_ip(h) for h in ("h0", "h1", "h2", "h4"))   # h0 h1 on leaf0, h2 leaf1, h4 leaf2
UPLINKS = range(FABRIC.spec.spines)           # leaf0's ports 0..3 go to spine0..3
H0_PORT = FABRIC.port_to("leaf0", "h0").index
MACS = {"src": "02:00:00:00:00:0a", "dst": "02:00:00:00:00:0b"}   # given: scapy would look them up in the routes


class Program:
    """One switch's program, compiled and held by this process, its maps set as the loader sets them."""

    def __init__(self, switch: str, loader: dp.Loader | None = None) -> None:
        self.switch = switch
        self.prog = (loader or dp.Loader()).load(dp.SwitchShape.of(FABRIC, switch))
        self.maps = dp.SwitchMaps.of_program(FABRIC, switch, self.prog)

    def reset(self, mode: SprayMode | None = SprayMode.RRDST, gap_ms: float = 1000.0, weights: dict | None = None,
              out_of_service: list[Link] | None = None) -> None:
        for m in self.maps.maps.values():
            for i in range(m.entries):
                m.set(i, m.value_type())
        self.maps.set_ports([100 + i for i in range(self.maps.nports)])   # redirect targets (never used)
        self.maps.set_config(mode, gap_ms)      # None: spraying off, plain kernel routing (the bench's baseline)
        self.maps.set_spray(weights or {}, out_of_service or [])

    def run(self, hook: str, port: int, frame, repeat: int = 1) -> tuple[int, bytes]:
        """Run the ``hook`` program on ``frame`` as if it crossed ``port`` (the test packet's device,
        the loopback, is mapped to that port)."""
        self.maps.maps["ifindex_port"].set(1, dp.U32(port + 1))
        return prog_test_run(self.prog.progs[f"fp_{hook}"], bytes(frame), repeat)

    def counts(self) -> np.ndarray:
        """The current pulse's packets [port, dir, src, kind] from its ring slot."""
        return self.maps.read_pulse(self.maps.pulse_state()[0]).counts

    def count(self, port: int, direction: str, src: int, kind: str) -> tuple[int, int]:
        """(packets of the current pulse from ``src``, bytes since the reset from every source): the
        ring counts packets per source class, the cumulative totals bytes per port and kind."""
        d, k = dp.DIRS.index(direction), dp.KINDS.index(kind)
        pkts = int(self.counts()[port, d, src, k])
        total = self.maps.totals()[port, d, k]
        assert total[0] >= pkts                                 # cumulative counts hold them too
        return pkts, int(total[1])

    def forwarded_to(self, port: int, frame) -> int | None:
        """The port the ingress program sends ``frame`` (arriving on ``port``) out of; None if it leaves
        it to the kernel. A test run redirects nowhere, so each candidate port in turn is the only one
        with an interface (the program leaves a packet for a port without one to the kernel)."""
        out = self.maps.maps["port_out"]
        held = [out.get(i) for i in range(self.maps.nports)]
        picked = []
        try:
            for cand in range(self.maps.nports):
                for i in range(self.maps.nports):
                    out.set(i, dp.PortOut(held[i].ifindex if i == cand else 0, held[i].nh4))
                if self.run("ingress", port, frame)[0] == TC_ACT_REDIRECT:
                    picked.append(cand)
        finally:
            for i, v in enumerate(held):
                out.set(i, v)
        assert len(picked) <= 1, picked
        return picked[0] if picked else None

    def sprayed(self) -> np.ndarray:
        return np.array(self.maps.spray_stats())

    def set_fault(self, text: str):
        spec = faults.parse_fault(FABRIC, text)
        site = FABRIC.fault_site(spec.link)
        assert site.switch == self.switch
        record = faults.kernel_record(spec)
        self.maps.set_fault(site.port, site.hook, record)
        return site, record

    def close(self) -> None:
        self.maps.close()
        self.prog.close()


@pytest.fixture(scope="module", autouse=True)
def _own_namespace():
    """The module's test runs happen in a network namespace of their own, IPv4 forwarding off: a
    test run's device is that namespace's loopback, so nothing of the host's (its routes, its
    forwarding setting) reaches a verdict. And on one CPU: the spray rotations are per CPU, and a run
    that moved to another CPU mid-sequence would start there from that CPU's own position (seen: a
    first frame slow to build moved the thread)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with private_netns():
            with open("/proc/sys/net/ipv4/conf/all/forwarding", "w") as f:   # this thread's namespace
                f.write("0")
            yield
    finally:
        os.sched_setaffinity(0, cpus)


@pytest.fixture(scope="module")
def leaf():
    p = Program("leaf0")
    yield p
    p.close()


@pytest.fixture(scope="module")
def spine():
    p = Program("spine1")
    yield p
    p.close()


def tcp(src=H0, dst=H2, sport=40000, dport=5000, payload=b"x" * 100, flags="PA", **kw):
    return Ether(**MACS) / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags=flags, **kw) / Raw(payload)


def class_of(ip: str) -> int:
    """Source class: source leaf + 1 for the testbed's host networks."""
    from netns_testbed.topo import node_num
    return node_num(FABRIC.source_leaf_of(ip)) + 1


# -- one compile, one copy per switch -------------------------------------------------------------

def test_one_compile_serves_every_switch_each_with_its_own_maps_and_identity():
    """The loader compiles once per fabric: two leaves and a spine share it (its maps are sized for
    the largest switch, a leaf's 6 ports; the spine's 3 are what its readers see). Each copy keeps its
    own maps, and sprays by its own leaf number (its config map): the same frame, h0 -> h2 (leaf1's
    host), is sprayed by leaf0 and sent by leaf1 to its own host's port, unsprayed."""
    loader = dp.Loader()
    a, b, c = Program("leaf0", loader), Program("leaf1", loader), Program("spine1", loader)
    try:
        assert len(loader.templates) == 1
        assert len({*a.prog.maps.values(), *b.prog.maps.values(), *c.prog.maps.values()}) == 3 * len(a.prog.maps)
        c.reset()
        assert c.maps.shape.port_slots == 6 and c.maps.nports == 3
        assert c.run("ingress", 2, tcp(src=H4, dst=H0))[0] == TC_ACT_REDIRECT  # from leaf2, sent to leaf0
        assert c.run("egress", 0, tcp(src=H4, dst=H0))[0] == TC_ACT_OK        # to leaf0
        assert c.counts().shape[0] == 3 and c.maps.totals().shape[0] == 3
        assert c.count(2, "in", class_of(H4), "tcp_data")[0] == 1 and c.count(0, "out", class_of(H4), "tcp_data")[0] == 1
        assert c.counts().sum() == 2 and len(c.maps.spray_stats()) == 3
        a.reset()
        b.reset()
        frame = tcp(src=H0, dst=H2)
        assert a.run("ingress", H0_PORT, frame)[0] == TC_ACT_REDIRECT
        assert a.counts().sum() == 1 and b.counts().sum() == 0
        host_port = FABRIC.port_to("leaf1", "h3").index
        assert b.run("ingress", host_port, frame)[0] == TC_ACT_REDIRECT     # to its own host, not sprayed
        assert b.counts().sum() == 1 and a.counts().sum() == 1 and sum(b.maps.spray_stats()) == 0
        assert b.run("ingress", host_port, tcp(src=H2, dst=H0))[0] == TC_ACT_REDIRECT
        assert b.maps.spray_stats() != [0] * len(b.maps.spray_stats()) and sum(a.maps.spray_stats()) == 1
    finally:
        a.close()
        b.close()
        c.close()


# -- kinds and source classes -------------------------------------------------------------------

KIND_CASES = {
    "tcp with payload": (tcp(), "tcp_data", class_of(H0)),
    "tcp SYN": (Ether(**MACS) / IP(src=H2, dst=H0) / TCP(flags="S"), "tcp_ctrl", class_of(H2)),
    "tcp ACK": (Ether(**MACS) / IP(src=H4, dst=H0) / TCP(flags="A"), "tcp_ctrl", class_of(H4)),
    "udp": (Ether(**MACS) / IP(src=H2, dst=H0) / UDP(sport=1, dport=2) / Raw(b"u" * 30), "other_ip", class_of(H2)),
    "icmp": (Ether(**MACS) / IP(src=H0, dst=H2) / ICMP(), "other_ip", class_of(H0)),
    "tcp behind IP options": (Ether(**MACS) / IP(src=H0, dst=H2, options=b"\x01\x01\x01\x00") / TCP() / Raw(b"d"),
                              "other_ip", class_of(H0)),
    "outside the address plan": (tcp(src="192.168.7.1"), "tcp_data", 0),
    "arp": (Ether(**MACS) / ARP(psrc=H0, pdst=H1), "non_ip", FABRIC.spec.leaves + 1),
    "ipv6": (Ether(**MACS) / IPv6() / UDP() / Raw(b"v"), "non_ip", FABRIC.spec.leaves + 1),
}


@pytest.mark.parametrize("case", list(KIND_CASES))
@pytest.mark.parametrize("hook", ["ingress", "egress"])
def test_each_packet_is_counted_once_by_kind_and_source(spine, case, hook):
    frame, kind, src = KIND_CASES[case]
    spine.reset()
    port = 2
    spine.run(hook, port, frame, repeat=3)
    direction = "in" if hook == "ingress" else "out"
    assert spine.count(port, direction, src, kind) == (3, 3 * len(bytes(frame)))
    assert spine.counts().sum() == 3, "counted once per run, in one cell"
    assert spine.maps.totals()[..., 0].sum() == 3


def test_a_broken_header_checksum_is_a_header_error_on_ingress_only(spine):
    frame = Ether(bytes(tcp()))
    frame[IP].chksum ^= 0x0101
    spine.reset()
    verdict, _ = spine.run("ingress", 0, frame)
    assert verdict == TC_ACT_OK                        # the kernel's IP input discards it
    assert spine.count(0, "in", class_of(H0), "bad_hdr")[0] == 1
    spine.run("egress", 0, frame)                      # a switch never sends one: egress does not look
    assert spine.count(0, "out", class_of(H0), "tcp_data")[0] == 1
    opts = Ether(bytes(Ether(**MACS) / IP(src=H0, dst=H2, options=b"\x01\x01\x01\x00") / TCP() / Raw(b"d")))
    spine.run("ingress", 0, opts)                      # options sum right: counted by kind
    assert spine.count(0, "in", class_of(H0), "other_ip")[0] == 1
    raw = bytearray(bytes(opts))
    raw[14 + 21] ^= 0x10                               # an option byte damaged: the sum covers it
    spine.run("ingress", 0, bytes(raw))
    assert spine.count(0, "in", class_of(H0), "bad_hdr")[0] == 2


def test_packets_from_a_device_that_is_not_a_port_are_left_alone(spine):
    spine.reset()
    spine.maps.maps["ifindex_port"].set(1, dp.U32(0))   # the loopback is no port of the switch
    assert prog_test_run(spine.prog.progs["fp_ingress"], bytes(tcp()))[0] == TC_ACT_UNSPEC
    assert prog_test_run(spine.prog.progs["fp_egress"], bytes(tcp()))[0] == TC_ACT_UNSPEC
    assert spine.counts().sum() == 0 and spine.maps.totals().sum() == 0


# -- D-SACKs ----------------------------------------------------------------------------------

def test_a_dsack_is_counted_on_its_port_and_a_plain_sack_is_not(leaf):
    leaf.reset()
    ack = 1_000_000
    dsack = Ether(**MACS) / IP(src=H0, dst=H2) / TCP(flags="A", ack=ack, options=[
        ("NOP", None), ("NOP", None), ("SAck", (ack - 2896, ack - 1448))])
    sack = Ether(**MACS) / IP(src=H0, dst=H2) / TCP(flags="A", ack=ack, options=[
        ("NOP", None), ("NOP", None), ("SAck", (ack + 1448, ack + 2896))])
    leaf.run("egress", 1, dsack)
    leaf.run("egress", 1, sack)
    dups = leaf.maps.read_pulse(0).dups
    assert dups[1, dp.DIRS.index("out")].tolist() == [1, 1448]
    assert dups.sum() == 1 + 1448


def test_a_dsack_behind_timestamps_is_counted_and_timestamps_alone_are_not(leaf):
    """Linux puts timestamps first (NOP NOP TS, 12 bytes); the program skips the option walk for a
    segment with exactly those options (most of a bulk transfer's segments: bench/program_cost.py
    times it), and walks the rest."""
    leaf.reset()
    ack = 1_000_000
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (7, 9))]
    behind_ts = Ether(**MACS) / IP(src=H0, dst=H2) / TCP(flags="A", ack=ack, options=[
        *ts, ("NOP", None), ("NOP", None), ("SAck", (ack - 2896, ack - 1448))])
    ts_only = Ether(**MACS) / IP(src=H0, dst=H2) / TCP(flags="A", ack=ack, options=ts)
    assert bytes(ts_only[TCP])[12] >> 4 == 8                 # the fast path's shape: 12 bytes of options
    leaf.run("egress", 1, behind_ts)
    leaf.run("egress", 1, ts_only, repeat=5)
    dups = leaf.maps.read_pulse(0).dups
    assert dups[1, dp.DIRS.index("out")].tolist() == [1, 1448]
    assert leaf.count(1, "out", class_of(H0), "tcp_ctrl")[0] == 6


# -- spraying ---------------------------------------------------------------------------------

def choices(prog: Program, frames) -> list[int]:
    """The uplink each frame was sprayed to (from the per-uplink statistics), in order."""
    out = []
    for frame in frames:
        before = prog.sprayed()
        verdict, _ = prog.run("ingress", H0_PORT, frame)
        moved = np.flatnonzero(prog.sprayed() - before)
        assert verdict == TC_ACT_REDIRECT and len(moved) == 1, (verdict, moved)
        out.append(int(moved[0]))
    return out


def test_rrdst_keeps_one_exact_rotation_per_destination_leaf(leaf):
    leaf.reset(SprayMode.RRDST)
    to_leaf1, to_leaf2 = tcp(dst=H2), tcp(dst=H4)
    picks = choices(leaf, [to_leaf1, to_leaf2] * 8)
    one, two = picks[0::2], picks[1::2]
    for seq in (one, two):
        assert sorted(seq[:4]) == list(UPLINKS) and seq[4:] == seq[:4], seq   # every window of 4: each once


def test_rr_shares_one_rotation_between_destinations(leaf):
    """The contrast with rrdst: interleaved destinations each see every other uplink."""
    leaf.reset(SprayMode.RR)
    picks = choices(leaf, [tcp(dst=H2), tcp(dst=H4)] * 4)
    assert sorted(picks[:4]) == list(UPLINKS)
    assert len(set(picks[0::2])) == 2 and len(set(picks[1::2])) == 2


def test_weights_give_exact_shares_in_every_table_cycle(leaf):
    weights = {"leaf0->spine0": 3.0, "leaf0->spine1": 1.0, "leaf0->spine2": 1.0, "leaf0->spine3": 1.0}
    leaf.reset(SprayMode.RRDST, weights=weights)
    picks = choices(leaf, [tcp(dst=H2)] * 60)
    assert np.bincount(picks, minlength=4).tolist() == [30, 10, 10, 10]
    for cycle in range(10):                                # each table cycle of 6 holds the exact shares
        assert np.bincount(picks[cycle * 6:(cycle + 1) * 6], minlength=4).tolist() == [3, 1, 1, 1]


def test_an_uplink_out_of_service_is_never_chosen(leaf):
    leaf.reset(SprayMode.RRDST, out_of_service=[Link("leaf0", "spine2")])
    picks = choices(leaf, [tcp(dst=H2)] * 30 + [tcp(dst=H4)] * 30)
    assert 2 not in picks and np.bincount(picks, minlength=4).tolist() == [20, 20, 0, 20]
    leaf.reset(SprayMode.RRDST, out_of_service=[Link("spine3", "leaf1")])   # spine3 cannot reach leaf1
    assert 3 not in choices(leaf, [tcp(dst=H2)] * 12)
    assert 3 in choices(leaf, [tcp(dst=H4)] * 4)


def test_random_spray_is_uniform(leaf):
    """4,000 packets: a chi-square test of uniformity at alpha 1e-6 (a correct program fails it
    once in a million runs)."""
    leaf.reset(SprayMode.RANDOM)
    n = 4000
    verdict, _ = leaf.run("ingress", H0_PORT, tcp(dst=H2), repeat=n)
    assert verdict == TC_ACT_REDIRECT
    counts = leaf.sprayed()[:4]
    assert counts.sum() == n
    assert stats.chisquare(counts).pvalue > 1e-6, counts


@pytest.mark.parametrize("mode", [*SprayMode, None])
def test_only_host_traffic_to_another_leaf_is_sprayed(leaf, mode):
    """A leaf sprays what its hosts send to other leaves; what is for its own hosts it sends to their
    ports itself; the rest (no leaf's address, the leaf's own address, not IPv4, from an uplink to
    another leaf) is the kernel's. With spraying off the kernel forwards everything."""
    leaf.reset(mode)
    on = mode is not None
    h1_port = FABRIC.port_to("leaf0", "h1").index
    assert leaf.forwarded_to(H0_PORT, tcp(src=H0, dst=H1)) == (h1_port if on else None)   # to a host of this leaf
    assert leaf.forwarded_to(1, tcp(src=H2, dst=H0)) == (H0_PORT if on else None)         # from an uplink
    assert leaf.forwarded_to(1, tcp(src=H2, dst=H4)) is None                              # from an uplink, onwards
    assert leaf.forwarded_to(H0_PORT, tcp(dst="192.168.7.1")) is None                     # to no leaf
    own = str(FABRIC.port_to("leaf0", "h1").address.ip)                                   # the leaf itself
    assert leaf.forwarded_to(H0_PORT, tcp(dst=own)) is None
    unused = f"10.1.{FABRIC.spec.hosts_per_leaf}.2"                                       # no host there
    assert leaf.forwarded_to(H0_PORT, tcp(dst=unused)) is None
    assert leaf.forwarded_to(H0_PORT, Ether(**MACS) / ARP(psrc=H0, pdst=H2)) is None
    assert leaf.sprayed().sum() == 0
    expected = TC_ACT_REDIRECT if on else TC_ACT_OK
    assert leaf.run("ingress", H0_PORT, tcp(dst=H2))[0] == expected
    assert leaf.sprayed().sum() == (1 if on else 0)


@pytest.mark.parametrize("mode", [SprayMode.RRDST, None])
def test_a_spine_sends_each_leafs_hosts_to_that_leafs_port(spine, mode):
    spine.reset(mode)
    for leaf in FABRIC.leaves:
        dst = FABRIC.host_ip(next(h for h in FABRIC.hosts if FABRIC.ports[h][0].peer == leaf))
        src_leaf = FABRIC.leaves[(FABRIC.leaves.index(leaf) + 1) % len(FABRIC.leaves)]
        port_in = FABRIC.port_to("spine1", src_leaf).index
        want = FABRIC.port_to("spine1", leaf).index if mode is not None else None
        assert spine.forwarded_to(port_in, tcp(src="10.9.0.2", dst=dst)) == want, leaf
    assert spine.forwarded_to(0, tcp(dst="192.168.7.1")) is None
    assert spine.forwarded_to(0, Ether(**MACS) / ARP(psrc=H0, pdst=H2)) is None


def test_the_egress_program_never_redirects(leaf):
    leaf.reset(SprayMode.RRDST)
    assert leaf.run("egress", H0_PORT, tcp(dst=H2))[0] == TC_ACT_OK
    assert leaf.sprayed().sum() == 0


# -- faults -------------------------------------------------------------------------------------

def fault_stats(prog: Program, site) -> tuple[int, int]:
    st = prog.maps.fault_stats(site.port, site.hook)
    return st.matched, st.hit


def test_a_blackhole_drops_everything_on_its_link_only(leaf):
    leaf.reset()
    site, _ = leaf.set_fault("leaf0->spine1:blackhole")
    assert leaf.run("egress", 1, tcp())[0] == TC_ACT_SHOT
    assert leaf.run("egress", 2, tcp())[0] == TC_ACT_OK
    assert leaf.count(1, "out", class_of(H0), "tcp_data")[0] == 1        # counted before the fault
    assert leaf.run("ingress", 1, tcp(src=H2, dst=H0))[0] == TC_ACT_REDIRECT   # the other direction, to h0
    assert fault_stats(leaf, site) == (1, 1)


def test_a_rate_zero_fault_matches_and_drops_nothing(leaf):
    leaf.reset()
    site, _ = leaf.set_fault("leaf0->spine1:drop=0")
    assert leaf.run("egress", 1, tcp(), repeat=500)[0] == TC_ACT_OK
    assert fault_stats(leaf, site) == (500, 0)


@pytest.mark.parametrize("rate", [0.01, 0.3])
def test_drop_rate_is_binomial(leaf, rate):
    """20,000 runs: the hits lie within 5.3 standard deviations of the rate (fails a correct
    program with probability about 1e-7)."""
    leaf.reset()
    site, _ = leaf.set_fault(f"leaf0->spine1:drop={rate}")
    n = 20_000
    leaf.run("egress", 1, tcp(), repeat=n)
    matched, hit = fault_stats(leaf, site)
    assert matched == n
    assert abs(hit - n * rate) <= 5.3 * math.sqrt(n * rate * (1 - rate)), hit


def test_corruption_breaks_the_header_checksum_and_the_next_hop_sees_a_header_error(leaf, spine):
    leaf.reset()
    spine.reset()
    site, _ = leaf.set_fault("leaf0->spine1:corrupt=1")
    frame = tcp()
    verdict, out = leaf.run("egress", 1, frame)
    assert verdict == TC_ACT_OK                        # sent on, damaged
    sent, got = Ether(bytes(frame)), Ether(out)
    assert got[IP].id == sent[IP].id ^ 0x5A5A and got[IP].chksum == sent[IP].chksum
    assert bytes(got[TCP]) == bytes(sent[TCP])
    assert fault_stats(leaf, site) == (1, 1)
    assert leaf.count(1, "out", class_of(H0), "tcp_data")[0] == 1   # counted as it left, before the damage
    spine.run("ingress", 0, out)                       # spine1's port 0 faces leaf0
    assert spine.count(0, "in", class_of(H0), "bad_hdr")[0] == 1


def test_corruption_on_a_host_link_is_a_header_error_at_the_leaf_and_never_sprayed(leaf):
    leaf.reset()
    site, _ = leaf.set_fault("h0->leaf0:corrupt=1")
    assert (site.port, site.hook) == (H0_PORT, "ingress")
    assert leaf.run("ingress", H0_PORT, tcp(dst=H2))[0] == TC_ACT_OK
    assert leaf.count(H0_PORT, "in", class_of(H0), "bad_hdr")[0] == 1
    assert leaf.sprayed().sum() == 0


def test_src_and_dst_select_the_packets_a_fault_touches(leaf):
    leaf.reset()
    site, _ = leaf.set_fault("leaf0->spine1:blackhole,src=h0,dst=leaf1")
    assert leaf.run("egress", 1, tcp(src=H0, dst=H2))[0] == TC_ACT_SHOT
    assert leaf.run("egress", 1, tcp(src=H1, dst=H2))[0] == TC_ACT_OK
    assert leaf.run("egress", 1, tcp(src=H0, dst=H4))[0] == TC_ACT_OK
    assert leaf.run("egress", 1, Ether(**MACS) / ARP(psrc=H0, pdst=H2))[0] == TC_ACT_OK
    assert fault_stats(leaf, site) == (1, 1)


def test_a_partial_fault_drops_whole_flows_in_proportion(leaf):
    """2,000 flows (source ports), each sent twice: every flow's two packets share a verdict, and the
    dropped share is within 5.3 standard deviations of 0.25 (fails a correct program about 1e-7)."""
    leaf.reset()
    leaf.set_fault("leaf0->spine1:partial=0.25")
    n = 2000
    dropped = 0
    for sport in range(10_000, 10_000 + n):
        a = leaf.run("egress", 1, tcp(sport=sport))[0]
        b = leaf.run("egress", 1, tcp(sport=sport, payload=b"other"))[0]
        assert a == b, sport
        dropped += a == TC_ACT_SHOT
    assert abs(dropped - n * 0.25) <= 5.3 * math.sqrt(n * 0.25 * 0.75), dropped


def test_a_flapping_fault_acts_only_in_its_on_window(leaf):
    leaf.reset()
    site, record = leaf.set_fault("leaf0->spine1:blackhole,flap=5/5")
    assert leaf.run("egress", 1, tcp())[0] == TC_ACT_SHOT          # t0 = now: inside the 5 s on window
    record.t0_ns = time.monotonic_ns() - 7 * 10 ** 9                # now 7 s into the period: off
    leaf.maps.set_fault(site.port, site.hook, record)
    assert leaf.run("egress", 1, tcp())[0] == TC_ACT_OK
    record.t0_ns = time.monotonic_ns() - 21 * 10 ** 9               # 21 s: the 3rd period's on window
    leaf.maps.set_fault(site.port, site.hook, record)
    assert leaf.run("egress", 1, tcp())[0] == TC_ACT_SHOT
    assert fault_stats(leaf, site) == (3, 2)


def test_clearing_a_fault_stops_it(leaf):
    leaf.reset()
    site, _ = leaf.set_fault("leaf0->spine1:blackhole")
    leaf.maps.clear_fault(site.port, site.hook)
    assert leaf.run("egress", 1, tcp())[0] == TC_ACT_OK


# -- pulses -------------------------------------------------------------------------------------

def pulses_expected(times_ns: list[int], gap_ms: float) -> int | None:
    """Pulses the program must see for IPv4 packets at ``times_ns``: one more at each interval longer
    than the gap. None when an interval lies within two clock units of the gap (the program compares
    2^20 ns units, so such an interval could go either way)."""
    gap = int(round(gap_ms * 1e6 / dp.PULSE_UNIT_NS)) * dp.PULSE_UNIT_NS
    n = 1
    for a, b in zip(times_ns, times_ns[1:]):
        if abs((b - a) - gap) < 2 * dp.PULSE_UNIT_NS:
            return None
        n += (b - a) > gap
    return n


def timed_run(prog: Program, hook: str, port: int, frame) -> int:
    """Run once; the time stamp is taken right after (a run takes microseconds)."""
    prog.run(hook, port, frame)
    return time.monotonic_ns()


def test_an_idle_gap_longer_than_the_configured_one_starts_a_pulse(spine):
    spine.reset(gap_ms=100.0)
    times = [timed_run(spine, "ingress", 0, tcp())]
    pid, last, start = spine.maps.pulse_state()
    assert pid == 1 and 0 <= start - last < dp.PULSE_UNIT_NS
    time.sleep(0.4)
    spine.run("ingress", 1, Ether(**MACS) / ARP())             # not IPv4: the pulse clock does not move
    assert spine.maps.pulse_state()[0] == 1
    spine.run("egress", 2, tcp())                        # the clock moves on ingress only (all a switch
    assert spine.maps.pulse_state()[0] == 1              # sends came in on one of its ports)
    times.append(timed_run(spine, "ingress", 2, tcp()))  # IPv4 in after 400 ms idle: the next pulse
    pid, last, start2 = spine.maps.pulse_state()
    assert pid == pulses_expected(times, 100.0) == 2
    assert times[0] < start2 <= times[1] and 0 <= start2 - last < dp.PULSE_UNIT_NS


def test_the_gap_runs_from_the_last_packet_not_the_pulse_start(spine):
    """Packets every 20 ms for about 600 ms under a 150 ms gap: one pulse, though it lasts four gaps.
    The expected count comes from the measured send times, so a busy machine that stalls this test
    longer than the gap changes the expectation, not the verdict."""
    for _ in range(3):
        spine.reset(gap_ms=150.0)
        times = []
        for _ in range(30):
            times.append(timed_run(spine, "ingress", 0, tcp()))
            time.sleep(0.02)
        expected = pulses_expected(times, 150.0)
        if expected is not None:
            assert spine.maps.pulse_state()[0] == expected
            return
    pytest.fail("three tries each had an interval within 2 ms of the gap")


# -- the ring of pulses -------------------------------------------------------------------------

# Gaps here are long (100-200 ms) beside what a test does within one pulse: a run with repeat=k is
# one syscall, but the kernel may reschedule between its repeats, and a stall longer than the gap
# on a busy machine would split the pulse.
def new_pulse(prog: Program, gap_ms: float) -> None:
    """Wait out the gap (checked against the clock, so a stalled test cannot make it short)."""
    t0 = time.monotonic_ns()
    time.sleep(3 * gap_ms / 1e3)
    assert time.monotonic_ns() - t0 > 2 * gap_ms * 1e6


def test_each_pulse_keeps_its_own_counts_until_the_ring_comes_round(spine):
    """Pulse k carries k packets; read after all of them, each pulse still has exactly its own, and
    the ring's oldest are reported overwritten once RING later pulses have opened."""
    gap = 100.0
    spine.reset(gap_ms=gap)
    ring = spine.maps.ring
    n = ring + 3
    for k in range(1, n + 1):
        spine.run("ingress", 0, tcp(), repeat=k)
        spine.run("egress", 1, tcp(), repeat=k)
        new_pulse(spine, gap)
    assert spine.maps.pulse_state()[0] == n
    for pulse in range(n - ring + 1, n + 1):
        got = spine.maps.read_pulse(pulse)
        assert not got.overwritten
        assert got.counts[0, 0, class_of(H0), dp.KINDS.index("tcp_data")] == pulse
        assert got.counts[1, 1, class_of(H0), dp.KINDS.index("tcp_data")] == pulse
        assert got.counts.sum() == 2 * pulse
        assert got.start_ns > 0 and (got.end_ns + dp.PULSE_UNIT_NS > got.start_ns or pulse == n)   # end: ~1 ms units
    for pulse in range(1, n - ring + 1):
        assert spine.maps.read_pulse(pulse).overwritten, pulse
    assert spine.maps.totals()[..., 0].sum() == n * (n + 1)
    assert spine.maps.totals()[0, 0, dp.KINDS.index("tcp_data"), 1] == n * (n + 1) // 2 * len(tcp())


def test_pulse_records_give_each_pulse_its_start_and_end(spine):
    gap = 200.0
    spine.reset(gap_ms=gap)
    t0 = time.monotonic_ns()
    spine.run("ingress", 0, tcp())
    time.sleep(0.005)
    spine.run("ingress", 0, tcp())
    t1 = time.monotonic_ns()
    new_pulse(spine, gap)
    spine.run("ingress", 0, tcp())
    first, second = spine.maps.read_pulse(1), spine.maps.read_pulse(2)
    assert t0 <= first.start_ns <= t1
    assert first.start_ns + 4_000_000 <= first.end_ns + dp.PULSE_UNIT_NS and first.end_ns <= t1
    assert second.start_ns > first.end_ns and second.end_ns == 0          # still open


def test_dsacks_go_to_the_pulse_they_came_in(leaf):
    leaf.reset(gap_ms=100.0)
    ack = 5000
    dsack = Ether(**MACS) / IP(src=H0, dst=H2) / TCP(flags="A", ack=ack, options=[("SAck", (ack - 100, ack - 50))])
    leaf.run("ingress", H0_PORT, dsack)
    new_pulse(leaf, 100.0)
    leaf.run("ingress", H0_PORT, dsack, repeat=2)
    assert leaf.maps.read_pulse(1).dups[H0_PORT, 0].tolist() == [1, 50]
    assert leaf.maps.read_pulse(2).dups[H0_PORT, 0].tolist() == [2, 100]


# -- the owner's same-packet reference: new bytes against the flows' sequence spans ----------------

MSS = 1448


def spans(p: Program, port: int, remote: int) -> dict[str, int]:
    """The current pulse's span sums on ``port`` for remote leaf class ``remote``."""
    got = p.maps.read_pulse(p.maps.pulse_state()[0]).spans[port, remote]
    return dict(zip(dp.SPAN_FIELDS, (int(x) for x in got)))


def seg(seq: int, n: int = MSS, sport: int = 41000, src=H0, dst=H2, flags="A", ip_id: int = 1):
    """A data segment; ``ip_id`` is its IPv4 ID (scapy's default 1 for all: a sender whose IDs do not move)."""
    pkt = tcp(src=src, dst=dst, sport=sport, seq=seq % (1 << 32), payload=b"y" * n, flags=flags)
    pkt[IP].id = ip_id % (1 << 16)
    return pkt


def test_a_spine_adds_each_flows_span_and_new_bytes_per_ingress_port_and_destination_leaf(spine):
    """Spine1 sees every fourth segment of a flow from leaf0 to leaf1: each one moves the flow's highest
    end by four segments' bytes (the span) and brings one segment's new bytes; the flow's first segment
    on the port only sets the end, so the two sums stay paired. The remote leaf is the destination's."""
    spine.reset()
    dst_class = class_of(H2)                      # leaf1's class: the destination leaf at a spine
    for i in range(0, 40, 4):                     # segments 0, 4, 8, ... 36 of the flow
        assert spine.run("ingress", 0, seg(1000 + i * MSS, sport=41001))[0] == TC_ACT_REDIRECT
    got = spans(spine, 0, dst_class)
    assert got == {"first": 9, "resent": 0, "new_bytes": 9 * MSS, "span": 36 * MSS}
    assert sum(spans(spine, 0, c)["first"] for c in range(dp.SwitchShape.of(FABRIC, "spine1").nsrc)) == 9
    assert spans(spine, 1, dst_class)["first"] == 0           # other ports untouched


def ends_at_1_5_9(spine, base: int, sport: int) -> int:
    """A fresh spine's port 0 gets a flow's segments ending at 1, 5 and 9 segments past ``base`` (the
    first sets the end, the next two span 8); returns the class of their destination leaf."""
    spine.reset()
    c = class_of(H2)
    for i in (0, 4, 8):
        spine.run("ingress", 0, seg(base + i * MSS, sport=sport))
    assert spans(spine, 0, c) == {"first": 2, "resent": 0, "new_bytes": 2 * MSS, "span": 8 * MSS}
    return c


def test_a_retransmission_counts_as_resent_never_as_new(spine):
    """A segment below the flow's last advance on the port (a retransmission: of a segment sent over
    another spine, or of its own lost one, a round trip later) moves neither sum: a reference that
    took it for new data would read a loss on this link as less than it is, and a loss elsewhere as a
    surplus here. Its own last segment again is resent too."""
    base = 50_000
    c = ends_at_1_5_9(spine, base, 41002)
    spine.run("ingress", 0, seg(base + 1 * MSS, sport=41002))          # resent from below the last advance
    spine.run("ingress", 0, seg(base + 4 * MSS, sport=41002))          # its own earlier segment again
    spine.run("ingress", 0, seg(base + 8 * MSS, sport=41002))          # its own last segment again
    assert spans(spine, 0, c) == {"first": 2, "resent": 3, "new_bytes": 2 * MSS, "span": 8 * MSS}
    # a resent segment that carries new data beyond the end counts only the bytes beyond it
    spine.run("ingress", 0, seg(base + 8 * MSS, n=2 * MSS, sport=41002))
    assert spans(spine, 0, c) == {"first": 3, "resent": 3, "new_bytes": 3 * MSS, "span": 9 * MSS}


def test_a_segment_overtaken_on_the_way_is_new_where_it_lands(spine):
    """Two CPUs forwarding one flow can swap two of the port's own segments: the later one moves the
    end over both, the earlier arrives inside that last advance and its bytes are new here (the
    advance spanned them). Counted as resent, every such swap would read as a lost segment."""
    spine.reset()
    c = class_of(H2)
    base = 70_000
    spine.run("ingress", 0, seg(base, sport=41006))                    # end 1
    spine.run("ingress", 0, seg(base + 8 * MSS, sport=41006))          # overtook segment 4: end 9, last advance 1..9
    spine.run("ingress", 0, seg(base + 4 * MSS, sport=41006))          # segment 4, late
    assert spans(spine, 0, c) == {"first": 2, "resent": 0, "new_bytes": 2 * MSS, "span": 8 * MSS}
    spine.run("ingress", 0, seg(base + 12 * MSS, sport=41006))         # end 13, last advance 9..13
    spine.run("ingress", 0, seg(base + 4 * MSS, sport=41006))          # below it now: a retransmission
    assert spans(spine, 0, c) == {"first": 3, "resent": 1, "new_bytes": 3 * MSS, "span": 12 * MSS}


def test_a_segment_overtaken_by_several_advances_is_new_if_sent_before_the_one_that_moved_the_end(spine):
    """Live bursts reorder a flow by several of the port's segments (each hop's per-CPU backlogs). A
    Linux sender numbers its packets (the IPv4 ID, per connection): a segment below the end whose ID
    is older than that of the segment that moved the end there was sent before it, so it is a first
    transmission overtaken twice over, and new here; one with a newer ID was sent after it, a
    retransmission, even inside the last advance. By sequence alone the first would be resent (a
    false loss of one segment) and the second new (a real loss hidden)."""
    spine.reset()
    c = class_of(H2)
    base = 110_000
    for i, ip_id in ((0, 100), (12, 112), (16, 116)):               # segments 4 and 8 overtaken by 12 and 16
        spine.run("ingress", 0, seg(base + i * MSS, sport=41014, ip_id=ip_id))
    spine.run("ingress", 0, seg(base + 4 * MSS, sport=41014, ip_id=104))     # two advances late, sent before
    spine.run("ingress", 0, seg(base + 8 * MSS, sport=41014, ip_id=108))
    assert spans(spine, 0, c) == {"first": 4, "resent": 0, "new_bytes": 4 * MSS, "span": 16 * MSS}
    spine.run("ingress", 0, seg(base + 13 * MSS, sport=41014, ip_id=130))    # inside the last advance, sent after
    spine.run("ingress", 0, seg(base + 4 * MSS, sport=41014, ip_id=131))     # far below, sent after
    assert spans(spine, 0, c) == {"first": 4, "resent": 2, "new_bytes": 4 * MSS, "span": 16 * MSS}
    # the ID is 16 bits: serial arithmetic across its wrap
    spine.run("ingress", 0, seg(base + 24 * MSS, sport=41014, ip_id=65_534))
    spine.run("ingress", 0, seg(base + 28 * MSS, sport=41014, ip_id=65_538))  # wraps to 2, moves the end
    spine.run("ingress", 0, seg(base + 20 * MSS, sport=41014, ip_id=65_530))  # older than both: overtaken
    spine.run("ingress", 0, seg(base + 21 * MSS, sport=41014, ip_id=65_539))  # newer (3): resent
    assert spans(spine, 0, c) == {"first": 7, "resent": 3, "new_bytes": 7 * MSS, "span": 28 * MSS}


def test_below_an_end_an_ack_moved_every_segment_is_resent_whatever_its_id(spine):
    """The receiver's ACK moves the end with no segment's ID: below it the receiver has every byte, so
    a segment there is resent even with an ID older than the port's last segment's."""
    spine.reset()
    c = class_of(H2)
    base = 130_000
    for i, ip_id in ((0, 500), (4, 504)):
        spine.run("ingress", 0, seg(base + i * MSS, sport=41016, ip_id=ip_id))
    spine.run("ingress", 1, ack(base + 10 * MSS, 41016))
    spine.run("ingress", 0, seg(base + 2 * MSS, sport=41016, ip_id=502))
    assert spans(spine, 0, c) == {"first": 1, "resent": 1, "new_bytes": MSS, "span": 9 * MSS}


def test_spans_cross_the_sequence_wrap_and_a_new_connection_starts_over(spine):
    spine.reset()
    c = class_of(H2)
    top = (1 << 32) - 2 * MSS
    spine.run("ingress", 0, seg(top, sport=41003))
    spine.run("ingress", 0, seg(top + 4 * MSS, sport=41003))           # past 2^32
    assert spans(spine, 0, c) == {"first": 1, "resent": 0, "new_bytes": MSS, "span": 4 * MSS}
    # the same addresses and ports open a new connection at another initial sequence number
    spine.run("ingress", 0, seg(7, n=0, sport=41003, flags="S"))
    spine.run("ingress", 0, seg(123_456, sport=41003))                 # first segment: sets the end
    spine.run("ingress", 0, seg(123_456 + 2 * MSS, sport=41003))
    assert spans(spine, 0, c) == {"first": 2, "resent": 0, "new_bytes": 2 * MSS, "span": 6 * MSS}
    # a jump no window allows restarts the flow instead of counting a span of 2^30 bytes
    spine.run("ingress", 0, seg(123_456 + (1 << 30), sport=41003))
    spine.run("ingress", 0, seg(123_456 + (1 << 30) + MSS, sport=41003))
    assert spans(spine, 0, c) == {"first": 3, "resent": 0, "new_bytes": 3 * MSS, "span": 7 * MSS}


def ack(n: int, sport: int, src=H0, dst=H2, flags="A", payload=b""):
    """The receiver's ACK of a flow ``src`` -> ``dst`` on ``sport`` (it comes back from ``dst``)."""
    return tcp(src=dst, dst=src, sport=5000, dport=sport, ack=n % (1 << 32), flags=flags, payload=payload)


def test_an_ack_moves_the_reference_of_the_data_that_comes_in_where_it_goes_out(spine):
    """The receiver's ACKs of a flow from leaf0 cross spine1 towards leaf0 (out of port 0): one beyond
    the highest end port 0 has seen moves the end, the span grows by what the receiver got over the
    other spines, and no new bytes come with it. A segment below the acknowledged end is then resent;
    the next one beyond it is new, and spans only the bytes past the ACK (the sum is the same as
    without ACKs, only on time)."""
    base = 90_000
    c = ends_at_1_5_9(spine, base, 41010)
    assert spine.run("ingress", 1, ack(base + 12 * MSS, 41010))[0] == TC_ACT_REDIRECT   # out of port 0
    assert spans(spine, 0, c) == {"first": 2, "resent": 0, "new_bytes": 2 * MSS, "span": 11 * MSS}
    spine.run("ingress", 1, ack(base + 10 * MSS, 41010))               # an older ACK, overtaken: nothing
    spine.run("ingress", 1, ack(base + 12 * MSS, 41010))               # a duplicate ACK: nothing
    spine.run("ingress", 0, seg(base + 11 * MSS, sport=41010))         # below the acknowledged end: resent
    assert spans(spine, 0, c) == {"first": 2, "resent": 1, "new_bytes": 2 * MSS, "span": 11 * MSS}
    spine.run("ingress", 0, seg(base + 12 * MSS, sport=41010))         # the next one: new, spans itself
    assert spans(spine, 0, c) == {"first": 3, "resent": 1, "new_bytes": 3 * MSS, "span": 12 * MSS}
    assert spans(spine, 1, class_of(H0)) == {"first": 0, "resent": 0, "new_bytes": 0, "span": 0}


def test_a_flow_whose_data_never_arrives_has_a_span_from_its_acks_and_no_new_bytes(spine):
    """A flow-selective blackhole on leaf0 -> spine1 takes every segment of some flows: the spine sees
    none of their data, only their ACKs on the way back. The first ACK sets the end, each advance adds
    to the span of port 0 (the link the data should have come in on): new bytes 0 against a span is
    the whole loss. ACKs that carry data, SYN-ACKs and ACKs from no fabric leaf add nothing."""
    spine.reset()
    c = class_of(H2)
    base = 123_000
    spine.run("ingress", 1, ack(base, 41011))
    assert spans(spine, 0, c)["span"] == 0
    spine.run("ingress", 1, ack(base + 5 * MSS, 41011))
    spine.run("ingress", 1, ack(base + 9 * MSS, 41011))
    assert spans(spine, 0, c) == {"first": 0, "resent": 0, "new_bytes": 0, "span": 9 * MSS}
    spine.run("ingress", 1, ack(base + 20 * MSS, 41011, payload=b"d" * 100))   # data the other way
    spine.run("ingress", 1, ack(base + 30 * MSS, 41011, flags="SA"))
    spine.run("ingress", 1, ack(base + 40 * MSS, 41011, flags="P"))            # no ACK flag
    assert spans(spine, 0, c)["span"] == 9 * MSS
    # a new connection on the same addresses and ports starts over from its first ACK
    spine.run("ingress", 0, seg(7, n=0, sport=41011, flags="S"))
    spine.run("ingress", 1, ack(555_000, 41011))
    spine.run("ingress", 1, ack(555_000 + 2 * MSS, 41011))
    assert spans(spine, 0, c)["span"] == 11 * MSS


def test_a_leaf_keeps_spans_on_its_uplinks_by_source_leaf_and_none_for_hosts(leaf):
    """At a leaf the remote leaf is the source's (the uplink names the spine); a host port, and
    packets a leaf sends, keep none. Acknowledgements and UDP carry no sequence span."""
    leaf.reset()
    src = class_of(H4)                            # from leaf2's host to leaf0's host h0
    for i in (0, 4, 8):
        leaf.run("ingress", 1, seg(9000 + i * MSS, sport=41004, src=H4, dst=H0))
    leaf.run("ingress", 1, tcp(src=H4, dst=H0, sport=41004, flags="A", payload=b""))
    leaf.run("ingress", 1, Ether(**MACS) / IP(src=H4, dst=H0) / UDP(sport=1, dport=2) / Raw(b"z" * 100))
    assert spans(leaf, 1, src) == {"first": 2, "resent": 0, "new_bytes": 2 * MSS, "span": 8 * MSS}
    for i in (0, 4, 8):
        leaf.run("ingress", H0_PORT, seg(9000 + i * MSS, sport=41005, src=H0, dst=H2))
    got = leaf.maps.read_pulse(leaf.maps.pulse_state()[0]).spans
    assert got[H0_PORT].sum() == 0 and got[:, class_of(H0)].sum() == 0
