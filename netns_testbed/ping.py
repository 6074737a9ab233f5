"""All-pairs reachability between hosts, with ICMP echo sockets opened inside namespaces.

No `ping` binary and no process per probe: the raw socket is created while the
thread is in the source host's namespace and keeps sending from there.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import time
from dataclasses import dataclass

from netns_testbed.nsutil import in_netns
from netns_testbed.state import Testbed


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


@dataclass
class PingResult:
    src: str
    dst: str
    sent: int
    received: int
    rtt_ms: float | None

    @property
    def ok(self) -> bool:
        return self.received > 0


def ping(tb: Testbed, src: str, dst: str, count: int = 1, timeout: float = 1.0) -> PingResult:
    """ICMP echo from host ``src`` to host ``dst``; returns counts and the best RTT."""
    with in_netns(tb.ns(src)):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    target = tb.fabric.host_ip(dst)
    ident = (os.getpid() + hash((src, dst))) & 0xFFFF
    received, best = 0, None
    try:
        for seq in range(count):
            payload = struct.pack("!d", time.monotonic()) + b"flowpulse"
            hdr = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr + payload), ident, seq) + payload
            t0 = time.monotonic()
            sock.sendto(pkt, (target, 0))
            deadline = t0 + timeout
            while (left := deadline - time.monotonic()) > 0:
                r, _, _ = select.select([sock], [], [], left)
                if not r:
                    break
                data, addr = sock.recvfrom(2048)
                ihl = (data[0] & 0x0F) * 4
                typ, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
                if typ == 0 and rid == ident and rseq == seq and addr[0] == target:
                    received += 1
                    rtt = (time.monotonic() - t0) * 1e3
                    best = rtt if best is None else min(best, rtt)
                    break
    finally:
        sock.close()
    return PingResult(src, dst, count, received, best)


def all_pairs(tb: Testbed, count: int = 1, timeout: float = 1.0) -> list[PingResult]:
    hosts = tb.fabric.hosts
    return [ping(tb, a, b, count, timeout) for a in hosts for b in hosts if a != b]


def unreachable_outside(tb: Testbed, host: str, address: str = "192.0.2.1") -> bool:
    """True if ``host`` has no route to an address outside the fabric (TEST-NET-1 by default)."""
    with in_netns(tb.ns(host)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((address, 9))
        return False
    except OSError:
        return True
    finally:
        s.close()
