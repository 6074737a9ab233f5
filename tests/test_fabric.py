"""Real testbeds (root): connectivity, spraying, exact counters, faults, cleanup, bad input."""
from __future__ import annotations

import errno
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from netns_testbed import bpfmaps, builder, faults, hooks
from netns_testbed.bpfmaps import loaded_programs, tcx_supported
from netns_testbed.builder import SINK_IFNAME
from netns_testbed.errors import EnvironmentProblem
from netns_testbed.hooks import Hook
from netns_testbed.counters import port_rows
from netns_testbed.datapath import KINDS, interface_stats
from netns_testbed.nsutil import in_netns, iproute, snmp
from netns_testbed.ping import all_pairs, unreachable_outside
from netns_testbed.state import RUN_DIR, Testbed
from netns_testbed.topo import namespace
from tests.conftest import new_prefix
from tests.traffic import assert_counters_equal_kernel, mac_of, raw_send, settle, stable_snapshot, udp_blast

pytestmark = pytest.mark.root
Z = 5.0  # two-sided z for the statistical checks: false failure ~6e-7 per check



def leftovers_of(prefix: str) -> dict:
    ns = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
          if n.startswith(prefix + "-")]
    mounts = [l for l in open("/proc/mounts") if f"/{prefix}/" in l]
    return {"namespaces": ns, "mounts": mounts, "state_dir": (RUN_DIR / prefix).exists(),
            "lock": (RUN_DIR / f".{prefix}.lock").exists()}


def assert_gone(prefix: str) -> None:
    assert leftovers_of(prefix) == {"namespaces": [], "mounts": [], "state_dir": False, "lock": False}


def uplink_pkts(tb: Testbed, leaf: str) -> np.ndarray:
    m = tb.maps(leaf)
    try:
        c = m.totals()
    finally:
        m.close()
    return c[: tb.fabric.spec.spines, 1, :3, 0].sum(axis=1)  # out on uplinks, IPv4


def test_default_fabric_all_pairs_and_no_way_out(default_testbed):
    tb = default_testbed
    results = all_pairs(tb)
    assert len(results) == 8 * 7
    assert [(r.src, r.dst) for r in results if not r.ok] == []
    for h in tb.fabric.hosts:
        assert unreachable_outside(tb, h)


def test_sprayed_packets_name_their_next_hop(default_testbed):
    """A leaf's spray hands the kernel each uplink's next hop (no route lookup per packet): the
    address the datapath holds for each port is the one the peer's interface carries, as `ip`
    reads it in the peer's namespace; the all-pairs test above is what breaks if the kernel cannot
    resolve it."""
    tb = default_testbed
    for leaf in tb.fabric.leaves:
        m = tb.maps(leaf)
        try:
            held = {p.index: m.maps["port_out"].get(p.index) for p in tb.fabric.ports[leaf]}
        finally:
            m.close()
        for p in tb.fabric.ports[leaf]:
            peer_ifname = tb.fabric.ports[p.peer][p.peer_index].ifname
            out = subprocess.run(["ip", "-n", tb.ns(p.peer), "-4", "-o", "addr", "show", "dev", peer_ifname],
                                 capture_output=True, text=True, check=True).stdout
            peer_ip = re.search(r"inet (\S+)/", out).group(1)
            with iproute(tb.ns(leaf)) as ipr:
                ifindex = ipr.link_lookup(ifname=p.ifname)[0]
            assert held[p.index].ifindex == ifindex, (leaf, p.ifname)
            assert held[p.index].nh4.to_bytes(4, sys.byteorder) == bytes(map(int, peer_ip.split("."))), (leaf, p.ifname)


def ethtool_features(ns: str, ifname: str) -> dict[str, bool]:
    """`ethtool -k` as the tool prints it (the independent view of what set_offloads did)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", ifname], capture_output=True, text=True,
                         check=True).stdout
    feats = {}
    for line in out.splitlines()[1:]:
        name, _, value = line.strip().partition(": ")
        feats[name] = value.startswith("on")
    return feats


def test_every_port_has_segmentation_offloads_off(default_testbed):
    """One skb must be one wire frame: tso (every tx-tcp*-segmentation, 6.18's AccECN one included), gso
    and gro off on both ends of every link, as `ethtool -k` reads them."""
    tb = default_testbed
    on = {}
    for node in tb.fabric.nodes:
        for p in tb.fabric.ports[node]:
            f = ethtool_features(tb.ns(node), p.ifname)
            seg = [k for k in f if re.fullmatch(r"tx-tcp.*-segmentation", k)]
            assert "tx-tcp-segmentation" in seg, f
            # ethtool prints gso and gro under their legacy names
            left = [k for k in seg + ["tcp-segmentation-offload", "generic-segmentation-offload",
                                      "generic-receive-offload"] if f[k]]
            if left:
                on[f"{node}:{p.ifname}"] = left
    assert on == {}


def test_iproute_socket_stays_in_its_namespace(default_testbed):
    """nsutil.iproute opens its socket inside the namespace and brings the thread back: the socket lists
    the namespace's ports, and this thread is in its own namespace again."""
    from netns_testbed.nsutil import iproute

    tb = default_testbed
    home = os.stat("/proc/thread-self/ns/net").st_ino
    with iproute(tb.ns("leaf0")) as ipr:
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
        names = {l.get_attr("IFLA_IFNAME") for l in ipr.get_links()}
    assert names == {"lo", SINK_IFNAME, SINK_IFNAME + "-peer"} | {p.ifname for p in tb.fabric.ports["leaf0"]}


def test_other_shape_2x3x1(make_testbed):
    tb = make_testbed(leaves=2, spines=3, hosts_per_leaf=1, mtu=9000, spray="random")
    assert all(r.ok for r in all_pairs(tb))
    assert interface_stats(tb.ns("leaf0"))  # readable
    from pyroute2 import IPRoute

    with IPRoute(netns=tb.ns("h0")) as ipr:
        assert ipr.get_links(ifname="eth0")[0].get_attr("IFLA_MTU") == 9000


def test_a_fabric_built_again_right_after_its_removal_comes_up():
    """Removing a testbed leaves the kernel dismantling its namespaces for a while, and the next
    namespace created waits for it (2.7 s measured after an 8x8x1 fabric with its datapath), past
    pyroute2's 2 s wait for the child that creates it: every second build in one process (a bench's
    runs, a test session) failed with "no response from the child". The same prefix, twice in a row."""
    from netns_testbed.builder import UpOptions
    from netns_testbed.topo import FabricSpec

    prefix = new_prefix()
    try:
        for _ in range(2):
            tb = builder.up(prefix, FabricSpec(leaves=8, spines=8, hosts_per_leaf=1), UpOptions())
            assert len(tb.fabric.switches) == 16
            builder.down(prefix)
    finally:
        builder.down(prefix)


@pytest.mark.parametrize("mode", ["rrdst", "rr", "random"])
def test_spray_shares(default_testbed, mode):
    tb = default_testbed
    builder.set_spray_mode(tb, mode)
    try:
        before = uplink_pkts(tb, "leaf0")
        n = 8000
        udp_blast(tb, "h0", "h2", n, flows=4)   # leaf0 -> leaf1
        udp_blast(tb, "h1", "h6", n, flows=4)   # leaf0 -> leaf3
        settle()
        got = uplink_pkts(tb, "leaf0") - before
    finally:
        builder.set_spray_mode(tb, "rrdst")
    total = got.sum()
    assert total >= 2 * n
    k = len(got)
    if mode == "random":
        # multinomial: each count ~ Binomial(total, 1/k)
        sd = math.sqrt(total * (1 / k) * (1 - 1 / k))
        assert np.all(np.abs(got - total / k) < Z * sd), got
    else:
        # exact rotation: per destination and CPU the split differs by at most one
        # packet; a few extra (ICMP errors, ARP-less control) may share the rotation
        ncpu = os.cpu_count() or 1
        assert got.max() - got.min() <= 2 * ncpu + 4, got


def test_counters_equal_kernel_statistics(default_testbed):
    """Crafted frames (scapy) of every kind: switch counters == kernel interface stats, per kind right."""
    tb = default_testbed
    h0_mac, gw_mac = mac_of(tb, "h0", "eth0"), mac_of(tb, "leaf0", "h0")
    src, dst = tb.fabric.host_ip("h0"), tb.fabric.host_ip("h5")
    eth = Ether(src=h0_mac, dst=gw_mac)
    frames = (
        [bytes(eth / IP(src=src, dst=dst) / TCP(sport=40000, dport=40001, flags="PA") / Raw(b"x" * 200))] * 30
        + [bytes(eth / IP(src=src, dst=dst) / TCP(sport=40000, dport=40001, flags="A"))] * 20
        + [bytes(eth / IP(src=src, dst=dst) / UDP(sport=40000, dport=40002) / Raw(b"y" * 50))] * 10
        + [bytes(eth / IP(src=src, dst=dst) / ICMP())] * 5
        + [bytes(Ether(src=h0_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=tb.fabric.port_to("leaf0", "h0").address.ip.compressed,
                                                                  psrc=src, hwsrc=h0_mac))] * 3
    )
    settle(0.2)
    before, kb = stable_snapshot(tb)
    raw_send(tb, "h0", frames)
    settle(0.5)
    after, ka = stable_snapshot(tb)
    checked = assert_counters_equal_kernel(tb, before, kb, after, ka)
    assert checked >= 2 * 68
    row_a, row_b = after["leaf0"][(4, "in")], before["leaf0"][(4, "in")]
    delta = {k: row_a[k] - row_b[k] for k in KINDS}
    assert delta["tcp_data"] == 30 and delta["tcp_ctrl"] == 20 and delta["non_ip"] >= 3
    assert delta["other_ip"] >= 15 and delta["bad_hdr"] == 0


def test_readonly_maps_refuse_writes(default_testbed):
    """The agent opens the pins read-only (BPF_F_RDONLY): the kernel refuses a write through them."""
    from netns_testbed.datapath import Config

    maps = default_testbed.maps("leaf0", readonly=True)
    try:
        assert maps.totals().shape[0] == len(default_testbed.fabric.ports["leaf0"])   # reads work
        assert maps.read_pulse(maps.pulse_state()[0]).counts.shape[0] == maps.totals().shape[0]
        with pytest.raises(OSError) as e:
            maps.maps["config"].set(0, Config(0, 1))
        assert e.value.errno == errno.EPERM
    finally:
        maps.close()


def test_dsack_blocks_counted_from_crafted_acks(default_testbed):
    """D-SACK (RFC 2883) detection in bpf/packet.h, on crafted TCP segments (scapy) from h0: counted on
    leaf0's port from h0, in segments and the bytes the block reports; plain SACKs and malformed
    options are not."""
    tb = default_testbed
    h0_mac, gw_mac = mac_of(tb, "h0", "eth0"), mac_of(tb, "leaf0", "h0")
    base = Ether(src=h0_mac, dst=gw_mac) / IP(src=tb.fabric.host_ip("h0"), dst=tb.fabric.host_ip("h5"))
    ack = 1_000_000
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (1, 2))]

    def seg(opts, payload=b"", a=ack):
        return bytes(base / TCP(sport=40100, dport=40101, flags="A", ack=a, options=opts) / Raw(payload))

    counted = [   # (frame, bytes its D-SACK reports)
        (seg(ts + [("NOP", None), ("NOP", None), ("SAck", (ack - 2896, ack - 1448))]), 1448),   # below the ACK
        (seg([("NOP", None), ("NOP", None), ("SAck", (ack - 1448, ack))]), 1448),               # no timestamps
        (seg(ts + [("SAck", (ack + 3000, ack + 4448, ack + 2000, ack + 9000))]), 1448),         # in the 2nd block
        (seg(ts + [("SAck", (ack - 500, ack - 100))], payload=b"d" * 300), 400),                # on a data segment
        (seg([("SAck", (0xFFFFF000, 0x00000100))], a=0x00001000), 0x1100),                      # across the wrap
    ]
    ignored = [
        seg(ts),                                                                 # no SACK
        seg(ts + [("SAck", (ack + 1448, ack + 2896))]),                          # a plain SACK above the ACK
        seg(ts + [("SAck", (ack + 3000, ack + 4448, ack + 5000, ack + 9000))]),  # first block outside the 2nd
        seg([("EOL", None), ("NOP", None), ("SAck", (ack - 1448, ack))]),        # after the end of options
        seg(ts + [("SAck", (ack - 100, ack - 500))]),                            # an empty (reversed) block
        bytes(base / TCP(sport=40100, dport=40101, flags="A", ack=ack, options=[("NOP", None)] * 3 + [(5, b"")])),
    ]
    port = tb.fabric.port_to("leaf0", "h0").index
    maps = tb.maps("leaf0")
    try:
        settle(0.2)
        first = maps.pulse_state()[0]
        before = maps.read_pulse(first).dups[port, 0].copy()
        raw_send(tb, "h0", [f for f, _ in counted] + ignored)
        settle(0.5)
        last = maps.pulse_state()[0]
        got = sum(maps.read_pulse(p).dups[port, 0] for p in range(first, last + 1)) - before
    finally:
        maps.close()
    assert got.tolist() == [len(counted), sum(b for _, b in counted)]


def _fault_delta(tb, fn):
    before = {r["link"]: (r["matched"], r["hit"]) for r in faults.listing(tb)}
    fn()
    settle()
    return {r["link"]: (r["matched"] - before.get(r["link"], (0, 0))[0], r["hit"] - before.get(r["link"], (0, 0))[1])
            for r in faults.listing(tb)}


def test_drop_rate_within_binomial_interval(default_testbed):
    tb = default_testbed
    p = 0.05
    faults.apply(tb, faults.parse_fault(tb.fabric, f"leaf0->spine1:drop={p}"))
    try:
        d = _fault_delta(tb, lambda: udp_blast(tb, "h0", "h2", 20000, flows=8))
    finally:
        faults.clear(tb, "leaf0->spine1")
    matched, hit = d["leaf0->spine1"]
    assert matched >= 20000 / 4 * 0.9
    assert abs(hit - matched * p) < Z * math.sqrt(matched * p * (1 - p)), (matched, hit)
    # and the downstream counter really misses them: spine1 got (sent on uplink 1) - hit
    assert tb.state.faults == {} or "leaf0->spine1" not in Testbed.load(tb.prefix).state.faults


def test_corruption_is_dropped_downstream_as_header_errors(default_testbed):
    tb = default_testbed
    p = 0.2
    before = snmp(tb.ns("leaf1"))["Ip"]
    bad_before = port_rows(tb, ["leaf1"])[2 * 2]["bad_hdr"]  # leaf1 port 2 (spine2) in
    faults.apply(tb, faults.parse_fault(tb.fabric, f"spine2->leaf1:corrupt={p}"))
    try:
        d = _fault_delta(tb, lambda: udp_blast(tb, "h6", "h2", 16000, flows=8))
    finally:
        faults.clear(tb, "spine2->leaf1")
    after = snmp(tb.ns("leaf1"))["Ip"]
    matched, hit = d["spine2->leaf1"]
    assert abs(hit - matched * p) < Z * math.sqrt(matched * p * (1 - p))
    assert hit > 0
    assert after["InHdrErrors"] - before["InHdrErrors"] == hit  # the kernel discarded exactly those
    assert port_rows(tb, ["leaf1"])[2 * 2]["bad_hdr"] - bad_before == hit


def test_partial_faults_touch_only_their_subset(default_testbed):
    tb = default_testbed
    # 1) only h0 -> h2 on leaf0->spine0 (all h1 -> h3 traffic passes the same link)
    faults.apply(tb, faults.parse_fault(tb.fabric, "leaf0->spine0:blackhole,src=h0,dst=h2"))
    try:
        d = _fault_delta(tb, lambda: (udp_blast(tb, "h0", "h2", 4000), udp_blast(tb, "h1", "h3", 4000)))
    finally:
        faults.clear(tb)
    matched, hit = d["leaf0->spine0"]
    assert matched == hit and 4000 / 4 * 0.9 <= hit <= 4000 / 4 * 1.1  # h0's quarter on spine0, nothing of h1's
    # 2) a fraction of flows, by hash: per flow all-or-nothing
    faults.apply(tb, faults.parse_fault(tb.fabric, "spine1->leaf2:partial=0.5"))
    try:
        d = _fault_delta(tb, lambda: udp_blast(tb, "h0", "h4", 6400, flows=64))
    finally:
        faults.clear(tb)
    matched, hit = d["spine1->leaf2"]
    assert matched > 0 and 0 < hit < matched
    # 64 flows x 25 packets on spine1: whole flows (multiples of ~25), about half
    assert abs(hit / matched - 0.5) < 0.3


def test_flapping_fault(default_testbed):
    tb = default_testbed
    faults.apply(tb, faults.parse_fault(tb.fabric, "leaf0->spine3:blackhole,flap=0.2/0.2"))
    try:
        def send():
            for _ in range(10):
                udp_blast(tb, "h0", "h2", 400, flows=4)
                time.sleep(0.05)
        d = _fault_delta(tb, send)
    finally:
        faults.clear(tb)
    matched, hit = d["leaf0->spine3"]
    assert matched > 0 and 0.15 < hit / matched < 0.85  # on about half of the time


def test_out_of_service_uplink_carries_nothing(make_testbed):
    tb = make_testbed(leaves=2, spines=3, hosts_per_leaf=1, out_of_service=["leaf0<->spine1"])
    before0, before1 = uplink_pkts(tb, "leaf0"), uplink_pkts(tb, "leaf1")
    udp_blast(tb, "h0", "h1", 3000, flows=4)
    udp_blast(tb, "h1", "h0", 3000, flows=4)
    assert all(r.ok for r in all_pairs(tb))
    settle()
    d0, d1 = uplink_pkts(tb, "leaf0") - before0, uplink_pkts(tb, "leaf1") - before1
    assert d0[1] == 0 and d1[1] == 0  # nothing to or via spine1 (it cannot reach leaf0)
    assert d0[0] > 1000 and d0[2] > 1000 and d1[0] > 1000 and d1[2] > 1000
    spine1 = tb.maps("spine1")
    try:
        assert spine1.totals()[:, :, :3, 0].sum() == 0
    finally:
        spine1.close()


def attached_program_ids(prefix: str, fabric) -> set[int]:
    """Ids of the programs attached (tcx or clsact) in this testbed's switch namespaces (other testbeds
    and test runs on the machine load their own: only these are this testbed's)."""
    ids = set()
    for sw in fabric.switches:
        ns = namespace(prefix, sw)
        with iproute(ns) as ipr, in_netns(ns):
            for port in fabric.ports[sw]:
                idx = ipr.link_lookup(ifname=port.ifname)[0]
                ids |= {i for progs in hooks.port_programs(ipr, idx).values() for _, i in progs}
    return ids


def test_two_ups_of_one_prefix_at_once_leave_the_winner_intact():
    """Two `fabric up` of one prefix started together: one builds, the other fails with one line and
    removes nothing of the winner's (its clean-up used to remove the winner's testbed)."""
    prefix = new_prefix()
    argv = [sys.executable, "-m", "flowpulse", "fabric", "up", "--prefix", prefix, "--leaves", "2", "--spines", "2",
            "--hosts-per-leaf", "1"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 4], outs          # 4: the testbed is not in the state the command needs
        loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 4)
        assert len(loser.strip().splitlines()) == 1 and prefix in loser, loser
        tb = Testbed.load(prefix)
        assert tb.state.status == "up" and builder.status(prefix)["healthy"]
        assert all(r.ok for r in all_pairs(tb))
    finally:
        builder.down(prefix)
    assert_gone(prefix)


def test_bpffs_is_root_only(make_testbed):
    tb = make_testbed(leaves=2, spines=1, hosts_per_leaf=1)
    mount = next(l.split() for l in open("/proc/mounts") if l.split()[1] == str(tb.dir / "bpf"))
    assert "mode=700" in mount[3].split(","), mount
    assert (os.stat(tb.dir / "bpf").st_mode & 0o777) == 0o700


@pytest.mark.parametrize("hook", list(Hook), ids=str)
def test_each_hook_counts_like_the_kernel_and_comes_down_clean(make_testbed, hook):
    """Both ways of attaching the switch programs (tcx links, and tc clsact where the kernel has no
    tcx): `fabric status` says which, each port runs exactly fp_ingress and fp_egress on it, the
    counters equal the kernel's interface statistics, and down removes every program (idempotent)."""
    if hook is Hook.TCX and not tcx_supported():
        pytest.skip(f"kernel {os.uname().release} has no tcx links (6.6+); the clsact case runs here")
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1, hook=hook)
    assert builder.status(tb.prefix)["hook"] == hook.label
    for sw in tb.fabric.switches:
        for port in tb.fabric.ports[sw]:
            names = hooks.port_program_names(namespace(tb.prefix, sw), port.ifname)
            assert names == {"ingress": [f"{hook}:fp_ingress"], "egress": [f"{hook}:fp_egress"]}, (sw, port.ifname)
    assert [(r.src, r.dst) for r in all_pairs(tb) if not r.ok] == []
    settle(0.2)
    before, kb = stable_snapshot(tb)
    udp_blast(tb, "h0", "h1", 2000)
    settle(0.5)
    after, ka = stable_snapshot(tb)
    assert assert_counters_equal_kernel(tb, before, kb, after, ka) >= 2 * 12
    ids = attached_program_ids(tb.prefix, tb.fabric)
    progs = loaded_programs()
    assert len(ids) == 2 * 4 and {progs[i] for i in ids} == {"fp_ingress", "fp_egress"}  # 4 switches, in + out
    assert builder.down(tb.prefix)
    assert_gone(tb.prefix)
    assert builder.down(tb.prefix) == []
    deadline = time.time() + 15   # the kernel frees programs asynchronously
    while ids & set(loaded_programs()) and time.time() < deadline:
        time.sleep(0.2)
    assert not ids & set(loaded_programs())


def test_the_hook_is_tcx_where_the_kernel_has_it(monkeypatch):
    """No --hook: tcx where the kernel has it, else clsact; --hook tcx on a kernel without it is the
    environment's problem (exit 3), found before anything is built."""
    monkeypatch.setattr(bpfmaps, "tcx_supported", lambda: False)
    assert hooks.choose(None) is Hook.CLSACT and hooks.choose(Hook.CLSACT) is Hook.CLSACT
    with pytest.raises(EnvironmentProblem, match="no tcx links"):
        hooks.choose(Hook.TCX)
    monkeypatch.setattr(bpfmaps, "tcx_supported", lambda: True)
    assert hooks.choose(None) is Hook.TCX and hooks.choose(Hook.CLSACT) is Hook.CLSACT


def test_failed_build_leaves_nothing(monkeypatch):
    from netns_testbed import datapath

    prefix = new_prefix()

    def boom(self, shape):
        raise RuntimeError("injected failure after namespaces and links exist")

    monkeypatch.setattr(datapath.Loader, "load", boom)
    opts = builder.UpOptions()
    with pytest.raises(RuntimeError, match="injected"):
        builder.up(prefix, builder.FabricSpec(leaves=2, spines=2, hosts_per_leaf=1), opts)
    assert_gone(prefix)
    assert opts.hook is None          # the hook was chosen for this build only: the caller's options are theirs


def test_sigkilled_builder_is_cleaned_by_down():
    prefix = new_prefix()
    proc = subprocess.Popen([sys.executable, "-m", "flowpulse", "fabric", "up", "--prefix", prefix,
                             "--leaves", "2", "--spines", "2", "--hosts-per-leaf", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and len(leftovers_of(prefix)["namespaces"]) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert leftovers_of(prefix)["namespaces"], "builder was killed before it made anything"
    r = subprocess.run([sys.executable, "-m", "flowpulse", "fabric", "down", "--prefix", prefix],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert_gone(prefix)


def test_two_prefixes_side_by_side(make_testbed):
    a = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    b = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    assert all(r.ok for r in all_pairs(a)) and all(r.ok for r in all_pairs(b))
    faults.apply(a, faults.parse_fault(a.fabric, "h0->leaf0:blackhole"))
    assert not any(r.ok for r in all_pairs(a))
    assert all(r.ok for r in all_pairs(b))  # same names, other prefix: untouched
    builder.down(a.prefix)
    assert all(r.ok for r in all_pairs(b))


def cli(*args, pre="", env=None):
    code = f"import sys; {pre} from flowpulse.cli import main; sys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.parametrize("args,word,code", [
    (["fabric", "up", "--leaves", "0"], "bad leaves 0", 2),
    (["fabric", "up", "--spines", "99"], "bad spines 99", 2),
    (["fabric", "up", "--prefix", "Bad-Name"], "bad prefix", 2),
    (["fabric", "up", "--out-of-service", "leaf0<->spine9"], "unknown node 'spine9'", 2),
    (["fabric", "up", "--weight", "leaf0->spine1=abc"], "W must be a number", 2),
    (["fabric", "up", "--gap-ms", "0"], "--gap-ms: 0 is out of range", 2),
])
def test_bad_fabric_input(args, word, code):
    prefix = new_prefix()
    if "--prefix" not in args:
        args = [*args, "--prefix", prefix]
    r = cli(*args)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], r.stderr
    assert_gone(prefix)


def test_bad_fault_input(default_testbed):
    p = default_testbed.prefix
    for text, word in [("leaf1->spine9:drop=0.1", "unknown node"), ("leaf1->spine2:drop=1.2", "[0, 1]"),
                       ("leaf1->leaf2:drop=0.1", "no link"), ("leaf1->spine2:melt", "unknown fault kind")]:
        r = cli("fault", "add", text, "--prefix", p)
        assert r.returncode == 2 and word in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for args, word in [(["leaf1->spine2:delay=5ms"], "cannot delay"),
                       (["--backend", "netem", "leaf1->spine2:partial=0.5"], "netem selects no traffic"),
                       (["--backend", "netem", "leaf1->spine2:drop=0.1,src=h0"], "netem selects no traffic"),
                       (["leaf1->spine2:delay=99s"], "at most")]:
        r = cli("fault", "add", *args, "--prefix", p)
        assert r.returncode == 2 and word in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert Testbed.load(p).state.faults == {}
    r = cli("fault", "add", "leaf1->spine2:drop=0.1", "--prefix", "nosuch")
    assert r.returncode == 4 and "no testbed" in r.stderr


@pytest.mark.parametrize("args,word", [
    (["--all", "--alerts", "/nonexistent-dir/a.jsonl"], "does not exist"),
    (["--all", "--incidents", "/nonexistent-dir/i.jsonl"], "does not exist"),
    (["--all", "--incidents", "/tmp"], "is a directory"),
    (["--all", "--poll-ms", "0"], "--poll-ms"),
    (["--all", "--poll-ms", "nan"], "--poll-ms"),
    (["--all", "--duration", "-1"], "--duration"),
    (["--all", "--metrics-port", "70000"], "--metrics-port"),
    (["--switch", "leaf1", "--switch", "leaf1"], "given twice"),
    (["--all", "--min-rate", "2"], "--min-rate"),
    (["--all", "--fa-per-day", "inf"], "--fa-per-day: 'inf' is not a finite number"),
    (["--all", "--pulse-hz", "0"], "--pulse-hz: 0 is out of range"),
])
def test_bad_agent_input(args, word):
    """Checked before the testbed is even looked up (this prefix has none): one line, exit 2."""
    r = cli("agent", *args, "--prefix", "nosuch")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], r.stderr


@pytest.mark.root
def test_agent_metrics_port_in_use():
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        sk.listen()
        port = sk.getsockname()[1]
        r = cli("agent", "--all", "--metrics-port", str(port), "--prefix", "nosuch")
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot serve metrics" in lines[0] and "--metrics-port" in lines[0], r.stderr


def test_not_root_missing_bcc_missing_headers(monkeypatch, capsys):
    from flowpulse.cli import main

    prefix = new_prefix()
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: 1000)  # what an unprivileged user gets
        assert main(["fabric", "up", "--prefix", prefix]) == 3
    assert "rerun with sudo" in capsys.readouterr().err
    r = cli("fabric", "up", "--prefix", prefix, pre="sys.modules['bcc'] = None;")
    assert r.returncode == 3 and "python3-bpfcc" in r.stderr
    r = cli("fabric", "up", "--prefix", prefix, env={"BCC_KERNEL_SOURCE": "/nonexistent"})
    assert r.returncode == 3 and "kernel headers" in r.stderr
    assert_gone(prefix)


def test_a_testbed_built_by_another_version_asks_to_be_rebuilt(make_testbed):
    """A testbed built by an older checkout keeps its own program and maps after an upgrade. Opening
    them with this version's mirrors says so in one line (exit 3) instead of a traceback, or of a
    grown struct written into a smaller map and cut short without an error."""
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    pins = tb.dir / "bpf" / "leaf0"
    os.rename(pins / "port_out", pins / "port_ifindex")          # a map this version renamed
    r = cli("counters", "--prefix", tb.prefix, "--switch", "leaf0")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1, r.stderr
    assert "another version" in lines[0] and "port_ifindex" in lines[0] and "fabric down" in lines[0], lines[0]
    assert "link_" not in lines[0], lines[0]                     # tcx links' pins live beside the maps
    os.rename(pins / "port_ifindex", pins / "port_out")
    assert cli("counters", "--prefix", tb.prefix, "--switch", "leaf0").returncode == 0
    os.unlink(pins / "config")                                    # a config record smaller than this version's
    fd = bpfmaps.map_create(bpfmaps.MapSpec(2, 4, 16, 1, 0, b"config"))   # BPF_MAP_TYPE_ARRAY
    try:
        bpfmaps.obj_pin(fd, str(pins / "config"))
    finally:
        os.close(fd)
    r = cli("counters", "--prefix", tb.prefix, "--switch", "leaf0")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1, r.stderr
    assert "map config holds 1 values of 16 bytes" in lines[0], lines[0]
