"""The site agent's counting object (bpf/count.bpf.o, clang at build time, libbpf at run time) against
the same C compiled by BCC.

Not root: the object is current, a stale or missing one is refused with one line, and a drifted
mirror fails the build naming the fact. Root: both builds loaded side by side for one site and fed
the same scapy-crafted packets through BPF_PROG_TEST_RUN, one packet to each in turn, on one CPU:
every counter, D-SACK and total map is equal byte for byte (each CPU's value), and the pulses match.
"""
from __future__ import annotations

import ctypes as ct
import json
import os
import random
import shutil
import time

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from agent.counting import PROGRAMS, CountingProgram
from agent.site import CounterSource, load_site, site_of_testbed
from netns_testbed import bpfobject
from netns_testbed import datapath as dp
from netns_testbed.bpfmaps import map_update, prog_test_run
from netns_testbed.errors import EnvironmentProblem

from tests.test_site import FABRIC, fake_testbed, write

SWITCH = "spine1"
MACS = {"src": "02:00:00:00:00:0a", "dst": "02:00:00:00:00:0b"}
TC_ACT_UNSPEC = -1


def test_the_shipped_object_is_built_from_these_sources():
    bpfobject.check_current()          # scripts/setup.sh built it; a source changed since would fail here


def test_a_stale_or_missing_object_is_refused_with_the_command_that_rebuilds_it(tmp_path):
    obj = tmp_path / "count.bpf.o"
    with pytest.raises(EnvironmentProblem, match="not built.*setup.sh"):
        bpfobject.check_current(obj)
    shutil.copyfile(bpfobject.OBJECT, obj)
    with pytest.raises(EnvironmentProblem, match="no readable stamp"):
        bpfobject.check_current(obj)
    bpfobject.stamp_path(obj).write_text(json.dumps({"source_sha256": "0" * 64}))
    with pytest.raises(EnvironmentProblem, match="built from other sources.*rebuild"):
        bpfobject.check_current(obj)


def test_a_header_that_changes_makes_the_object_stale(tmp_path, monkeypatch):
    """switch.h and packet.h are #included, not spliced: the stamp covers them too."""
    bpf = tmp_path / "bpf"
    shutil.copytree(dp.BPF_DIR, bpf)
    monkeypatch.setattr(dp, "BPF_DIR", bpf)
    monkeypatch.setattr(bpfobject, "SRC", bpf / "count.c")
    before = bpfobject.source_digest()
    (bpf / "packet.h").write_text((bpf / "packet.h").read_text() + "\n// a change\n")
    assert bpfobject.source_digest() != before


def test_a_mirror_that_drifts_fails_the_build_naming_the_fact(tmp_path, monkeypatch):
    class Drifted(ct.Structure):      # struct fp_shape with its fields swapped
        _fields_ = [("nsrc", ct.c_uint32), ("nports", ct.c_uint32)]

    monkeypatch.setattr(dp, "Shape", Drifted)
    with pytest.raises(EnvironmentProblem, match=r"disagree: fp_shape.nsrc: offset 0 in Python"):
        bpfobject.build(tmp_path / "count.bpf.o")
    assert not (tmp_path / "count.bpf.o").exists()


def test_the_build_is_reproducible(tmp_path):
    """The same sources give the same bytes, wherever the checkout and the build directory are."""
    a = bpfobject.build(tmp_path / "a.bpf.o").read_bytes()
    assert a == bpfobject.build(tmp_path / "b.bpf.o").read_bytes()      # reproducible
    assert bpfobject.OBJECT.read_bytes() == a


def frames(rng: random.Random) -> list[tuple[int, str, bytes]]:
    """(port, program, frame): every kind the program tells apart, from every source class."""
    srcs = [FABRIC.host_ip(h) for h in ("h0", "h2", "h4", "h6")] + ["192.0.2.7"]     # 4 leaves, and no leaf
    out = []
    for i in range(600):
        src, dst = rng.choice(srcs), rng.choice(srcs)
        ip = IP(src=src, dst=dst)
        kind = rng.randrange(9)
        if kind <= 2:
            pkt = ip / TCP(sport=40000 + i % 7, dport=5000, flags="PA", seq=rng.randrange(1 << 32),
                           ack=rng.randrange(1 << 32)) / Raw(b"x" * rng.choice((1, 100, 1448)))
        elif kind == 3:
            pkt = ip / TCP(sport=40000 + i % 7, dport=5000, flags="A", ack=rng.randrange(1 << 32))
        elif kind == 4:       # a D-SACK: the SACK block lies below the cumulative ACK
            pkt = ip / TCP(sport=5000, dport=40000, flags="A", ack=100000,
                           options=[("NOP", None), ("NOP", None), ("SAck", (90000, 91448))])
        elif kind == 5:
            pkt = ip / UDP(sport=4791, dport=4791) / Raw(b"y" * 64)
        elif kind == 6:
            pkt = ip / ICMP()
        elif kind == 7:
            pkt = rng.choice([ARP(psrc=src, pdst=dst), IPv6() / UDP()])
        else:                 # an IPv4 header with a broken checksum
            pkt = IP(bytes(ip / UDP()))
            pkt.chksum = (pkt.chksum + 1) & 0xffff
        out.append((rng.randrange(len(FABRIC.ports[SWITCH])), rng.choice(PROGRAMS), bytes(Ether(**MACS) / pkt)))
    return out


@pytest.mark.root
def test_object_and_bcc_count_alike_packet_for_packet(tmp_path):
    data = {**site_of_testbed(fake_testbed(), SWITCH), "pulse_gap_ms": 20}
    progs = {}
    for counters in (CounterSource.EBPF, CounterSource.EBPF_BCC):
        site = load_site(write(tmp_path, {**data, "counters": str(counters)}, f"{counters}.yaml"))
        p = CountingProgram(site, [100 + i for i in range(len(site.ifnames))])   # not attached: never seen
        p.load()
        progs[counters] = p
    assert progs[CounterSource.EBPF].obj is not None and progs[CounterSource.EBPF_BCC].bpf is not None
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})      # per-CPU values land on one CPU for both programs
    try:
        rng = random.Random(7)
        batch = frames(rng)
        for n, (port, prog, frame) in enumerate(batch):
            if n in (200, 400):
                time.sleep(0.06)          # > the 20 ms gap: the next packet opens a pulse in both
            for p in progs.values():
                # the test packet's device is the loopback (ifindex 1): mapped to the packet's port
                map_update(p.map_fd("ifindex_port"), ct.c_uint32(1), ct.c_uint32(port))
                verdict, out = prog_test_run(p.prog_fds[prog], frame)
                assert verdict == TC_ACT_UNSPEC and out == frame      # counted, passed on untouched
    finally:
        os.sched_setaffinity(0, cpus)
    maps = {c: p.maps() for c, p in progs.items()}
    a, b = maps[CounterSource.EBPF], maps[CounterSource.EBPF_BCC]
    for name in ("counters", "dup", "totals"):
        assert bytes(a.maps[name]._batch()) == bytes(b.maps[name]._batch()), name
    ids = {c: [r.pulse for r in m.maps["pulses"].get_all()] for c, m in maps.items()}
    assert ids[CounterSource.EBPF] == ids[CounterSource.EBPF_BCC]
    assert sorted(i for i in ids[CounterSource.EBPF] if i) == [1, 2, 3]
    totals = a.maps["totals"].get_all_array()
    assert int(totals["pkts"].sum()) == len(batch)            # nothing missed, nothing counted twice
    assert a.pulse_state()[0] == b.pulse_state()[0] == 3
    per_pulse = []
    for pulse in (0, 1, 2, 3):    # 0: packets before the first IPv4 one (ARP, IPv6 do not move the clock)
        got = a.read_pulse(pulse).counts
        assert (got == b.read_pulse(pulse).counts).all(), pulse
        per_pulse.append(int(got.sum()))
    assert sum(per_pulse) == len(batch) and min(per_pulse[1:]) > 150, per_pulse
    assert a.read_pulse(2).counts[..., dp.KINDS.index("bad_hdr")].sum() > 0
    for p in progs.values():
        p.close()
