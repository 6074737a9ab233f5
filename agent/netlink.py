"""Pulses from the kernel's interface statistics (netlink), for machines where no program can be loaded.

Any NIC, bond or veth has packet counters (``IFLA_STATS64``); reading them needs
no BPF, only netlink. What they cannot give, and what that costs:

* **No split by source leaf.** Leaves judge their uplinks' totals (all source
  leaves together, :class:`agent.detector.checks.TotalsPeerCheck`): a deficit on
  uplink ``k`` points at ``spine_k->leaf`` or at any ``leafX->spine_k``, and no
  spine can settle which (the spines' balance test needs the split: off). So an
  incident names the spine's links, not the one link. Every leaf must spray alike
  (no links out of service, weights or degraded links).
* **Pulses cut by a sampler.** The counters are read every poll (10 ms by
  default); a pulse ends when they stood still for the site's gap. A pulse's
  edges are known to a poll, not to a packet, and whatever else crosses the
  port (ARP, IPv6 neighbour discovery, management traffic) is counted with it.
* **Everything counts.** Non-IP frames and ACKs are in the totals; only the
  totals' balance across uplinks is judged.
* **Damaged frames** are the NIC's own CRC and frame errors (``rx_crc_errors``,
  ``rx_frame_errors``): real NICs count them; veths never do, and a header the
  testbed's fault corrupts is dropped by IP, after the interface counted it.

What it catches, measured on the testbed: see ``tests/test_site_agent.py`` and docs/guides/site-agent.md.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from agent.pulse import PulseCounts
from agent.reader import wall_of

log = logging.getLogger("flowpulse.agent.netlink")


STATS_LINK_64 = 1   # RTM_GETSTATS filter: IFLA_STATS_FILTER_BIT(IFLA_STATS_LINK_64), nothing else


def read_stats(ipr, ifindexes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(packets [port, dir], damaged frames [port]) of the ports, in one RTM_GETSTATS dump of the
    64-bit link statistics only (0.3 ms for a few ports here; a full RTM_GETLINK dump is 1.1 ms)."""
    want = {ifx: i for i, ifx in enumerate(ifindexes)}
    pkts = np.zeros((len(ifindexes), 2), np.int64)
    bad = np.zeros(len(ifindexes), np.int64)
    seen = 0
    for msg in ipr.stats("dump", filter_mask=STATS_LINK_64):
        i = want.get(msg["ifindex"])
        if i is None:
            continue
        st = msg.get_attr("IFLA_STATS_LINK_64")
        pkts[i] = (st["rx_packets"], st["tx_packets"])
        bad[i] = st["rx_crc_errors"] + st["rx_frame_errors"]
        seen += 1
    if seen != len(ifindexes):
        raise RuntimeError(f"{len(ifindexes) - seen} of the site's interfaces disappeared")
    return pkts, bad


class NetlinkReader:
    """Yields :class:`PulseCounts` of one switch from its interface statistics (same ``poll()`` as the
    eBPF reader). Totals go in source class 0; ``data`` is None (no TCP payload split)."""

    def __init__(self, switch: str, ifindexes: list[int], nsrc: int, gap_ms: float) -> None:
        from pyroute2 import IPRoute

        self.switch = switch
        self.ifindexes = list(ifindexes)
        self.nsrc = nsrc
        self.gap_ns = int(gap_ms * 1e6)
        self.ipr = IPRoute()
        self.base, self.base_bad = read_stats(self.ipr, self.ifindexes)   # the end of the last pulse
        self.last = self.base                                            # at the last change
        self.last_bad = self.base_bad
        self.last_change_ns = 0
        self.start_ns = 0
        self.active = False
        self.pulse_id = 0
        # a pulse is given only if a whole gap of silence was seen before it began (agent.reader: a reader
        # started during a burst would cut its first pulse anywhere in it)
        self.whole_from_ns: int | None = time.monotonic_ns() + self.gap_ns
        self.skipped = 0
        self.resyncs = 0
        self.lost = 0          # (the eBPF reader's ring; interface statistics have none)
        self.reads = 0

    def poll(self) -> PulseCounts | None:
        now = time.monotonic_ns()
        pkts, bad = read_stats(self.ipr, self.ifindexes)
        self.reads += 1
        if (pkts < self.last).any():
            log.warning("%s: interface counters went backwards (reset): resynchronising", self.switch)
            self.resyncs += 1
            self.base = self.last = pkts
            self.base_bad = self.last_bad = bad
            self.active = False
            return None
        if (pkts != self.last).any():
            if not self.active:
                self.active = True
                self.start_ns = now
            self.last, self.last_bad, self.last_change_ns = pkts, bad, now
            return None
        if not self.active or now - self.last_change_ns < self.gap_ns:
            return None
        self.active = False
        if self.whole_from_ns is not None:
            if self.start_ns < self.whole_from_ns:      # began before a whole gap of silence was seen: partial
                log.info("%s: first pulse began before a whole gap of silence was seen: skipped", self.switch)
                self.skipped += 1
                self.base, self.base_bad = self.last, self.last_bad
                return None
            self.whole_from_ns = None
        delta = self.last - self.base
        dbad = self.last_bad - self.base_bad
        self.base, self.base_bad = self.last, self.last_bad
        self.pulse_id += 1
        n = len(self.ifindexes)
        ip = np.zeros((n, 2, self.nsrc), np.int64)
        ip[:, :, 0] = delta
        badc = np.zeros((n, 2), np.int64)
        badc[:, 0] = dbad
        return PulseCounts(self.switch, self.pulse_id, ip, badc, start_ns=self.start_ns, end_ns=self.last_change_ns,
                           start_time=wall_of(self.start_ns), end_time=wall_of(self.last_change_ns))

    def close(self) -> None:
        self.ipr.close()
