"""Test traffic generated inside host namespaces (sockets opened with setns).

Everything is addressed to hosts of the testbed itself; nothing leaves it.
"""
from __future__ import annotations

import socket
import time

from netns_testbed.counters import port_rows
from netns_testbed.datapath import interface_stats
from netns_testbed.nsutil import in_netns
from netns_testbed.state import Testbed


def udp_blast(tb: Testbed, src: str, dst: str, count: int, size: int = 64, port: int = 5001,
              flows: int = 1) -> None:
    """Send ``count`` UDP datagrams from host ``src`` to host ``dst`` over ``flows`` source ports.

    Nobody needs to listen: the destination answers with ICMP port-unreachable
    (rate-limited), which is fine for counting the datapath.
    """
    socks = []
    with in_netns(tb.ns(src)):
        for f in range(flows):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", 20000 + f))
            socks.append(s)
    target = (tb.fabric.host_ip(dst), port)
    payload = b"f" * size
    try:
        for i in range(count):
            sock = socks[i % flows]
            while True:
                try:
                    sock.sendto(payload, target)
                    break
                except BlockingIOError:
                    time.sleep(0.001)
    finally:
        for s in socks:
            s.close()


def raw_send(tb: Testbed, host: str, frames: list[bytes]) -> None:
    """Send whole Ethernet frames (e.g. built with scapy) out of ``host``'s eth0."""
    with in_netns(tb.ns(host)):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind(("eth0", 0))
    try:
        for f in frames:
            s.send(f)
    finally:
        s.close()


def mac_of(tb: Testbed, node: str, ifname: str) -> str:
    from pyroute2 import IPRoute

    with IPRoute(netns=tb.ns(node)) as ipr:
        return ipr.get_links(ifname=ifname)[0].get_attr("IFLA_ADDRESS")


def settle(seconds: float = 0.3) -> None:
    time.sleep(seconds)


def stable_snapshot(tb: Testbed):
    """Our counters and the kernel's, read with nothing arriving in between (background ARP
    can land between the two reads: then read again)."""
    for _ in range(20):
        ours = {sw: {(r["port"], r["dir"]): r for r in port_rows(tb, [sw])} for sw in tb.fabric.switches}
        kern = {sw: interface_stats(tb.ns(sw)) for sw in tb.fabric.switches}
        again = {sw: {(r["port"], r["dir"]): r for r in port_rows(tb, [sw])} for sw in tb.fabric.switches}
        if again == ours:
            return ours, kern
        time.sleep(0.05)
    raise AssertionError("fabric never quiet enough to compare counters")


def assert_counters_equal_kernel(tb: Testbed, before, kb, after, ka) -> int:
    """Per switch port and direction, our packet and byte counts moved exactly as the kernel's interface
    statistics between two :func:`stable_snapshot` s; returns the packets counted."""
    moved = 0
    for sw in tb.fabric.switches:
        for p in tb.fabric.ports[sw]:
            for d, kd in (("in", "rx"), ("out", "tx")):
                ours = [after[sw][(p.index, d)][k] - before[sw][(p.index, d)][k] for k in ("pkts", "bytes")]
                kern = [ka[sw][p.ifname][f"{kd}_{k}"] - kb[sw][p.ifname][f"{kd}_{k}"] for k in ("packets", "bytes")]
                assert ours == kern, (sw, p.ifname, d, ours, kern)
                moved += ours[0]
    return moved
