"""Cut a switch's cumulative eBPF counters into pulses, exactly.

The kernel program stamps every IPv4 packet and bumps a pulse id after an idle
gap (``gap_ms``), so pulse boundaries come from the traffic itself with packet
timing, not from this sampler. The reader only has to copy the cumulative
counters while the switch is idle: it checks that the pulse state (id and
last-packet time) is the same before and after the copy, so no packet
landed in between and the difference of two idle copies is exactly the
traffic of the pulse(s) between them.

Robustness: a counter that goes backwards (program reload, map reset) or a
change of the switch's shape resynchronises without producing a pulse; a pin
that was replaced (reload) is reopened.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from agent.pulse import PulseCounts
from netns_testbed.datapath import KINDS, PULSE_TIME_BITS

log = logging.getLogger("flowpulse.agent.reader")
IP_KINDS = [KINDS.index(k) for k in ("tcp_data", "tcp_ctrl", "other_ip")]   # IPv4 with a good header
DATA_KIND = KINDS.index("tcp_data")
BAD_KIND = KINDS.index("bad_hdr")
PULSE_ID_MOD = 1 << (64 - PULSE_TIME_BITS)


def wall_of(mono_ns: int) -> float:
    """Monotonic ns (what bpf_ktime_get_ns stamps) to Unix time."""
    return time.time() - (time.monotonic_ns() - mono_ns) / 1e9


class PulseReader:
    """Yields :class:`PulseCounts` of one switch as its pulses close.

    ``open_maps`` returns the switch's counter maps: anything with ``counters()`` (an int64 array
    [port, dir, src, kind, (pkts, bytes)]), ``pulse_state()`` (id, last packet ns, start ns),
    ``identity()`` (changes when the maps are replaced, e.g. by a reload; None if they cannot be)
    and ``close()``: the testbed's pinned maps (:func:`testbed_reader`) or the counting program a
    site agent loaded itself (``agent.counting``).

    The pulse numbers it gives (``PulseCounts.pulse``) are 64-bit and never go back: the kernel's
    id is 24 bits (it shares one atomic word with the last packet's time), and the reader unwraps
    it, adding each read's pulses modulo 2^24 (a wrap is missed only if 2^24 pulses pass between two
    polls: nine days at 20 pulses a second), and carries on from its last number when the maps are
    replaced or reset.
    """

    def __init__(self, switch: str, gap_ms: float, open_maps: Callable[[], object], margin_ms: float = 5.0) -> None:
        self.switch = switch
        self.gap_ns = int((gap_ms + margin_ms) * 1e6)
        self.open_maps = open_maps
        self.maps = None
        self._pin_ino = None
        self.snap: np.ndarray | None = None
        self.snap_dup: np.ndarray | None = None
        self.snap_pid = 0
        self.pulse_no: int | None = None     # the 64-bit pulse number of the last snapshot
        self.resyncs = 0
        self.reads = 0
        self._open()

    def _pin_identity(self):
        return self.maps.identity()

    def _open(self) -> None:
        if self.maps is not None:
            self.maps.close()
        self.maps = self.open_maps()
        self._pin_ino = self._pin_identity()
        self.snap = None

    def close(self) -> None:
        if self.maps is not None:
            self.maps.close()
            self.maps = None

    def poll(self) -> PulseCounts | None:
        """Return a pulse if one closed since the last call, else None. Cheap when idle."""
        assert self.maps is not None
        try:
            if self._pin_identity() != self._pin_ino:
                log.warning("%s: datapath maps were replaced (reload): resynchronising", self.switch)
                self.resyncs += 1
                self._open()
        except FileNotFoundError:
            raise RuntimeError(f"{self.switch}: the datapath's maps are gone (testbed down?)") from None
        pid, last_ns, start_ns = self.maps.pulse_state()
        if self.snap is not None and pid == self.snap_pid:
            return None
        if time.monotonic_ns() - last_ns < self.gap_ns and (pid != 0 or last_ns != 0):
            return None  # mid-pulse: wait for the idle gap (id 0 and time 0: no packet yet)
        counters = self.maps.counters()
        dups = self.maps.dups()
        self.reads += 1
        if self.maps.pulse_state()[:2] != (pid, last_ns):
            return None  # a packet arrived while copying: try again at the next poll
        if self.snap is None or self.snap.shape != counters.shape or self.snap_dup.shape != dups.shape:
            self.snap, self.snap_dup, self.snap_pid = counters, dups, pid
            if self.pulse_no is None:
                self.pulse_no = pid           # first baseline: the kernel's count so far
            return None
        delta, dup = counters - self.snap, dups - self.snap_dup
        if (delta < 0).any() or (dup < 0).any():
            log.warning("%s: counters went backwards (reset): resynchronising", self.switch)
            self.resyncs += 1
            self.snap, self.snap_dup, self.snap_pid = counters, dups, pid
            return None
        merged = (pid - self.snap_pid) % PULSE_ID_MOD   # the kernel's id wraps (24 bits beside the time)
        self.snap, self.snap_dup, self.snap_pid = counters, dups, pid
        self.pulse_no += merged
        pkts = delta[..., 0]
        ip = pkts[:, :, :, IP_KINDS].sum(axis=3)
        bad = pkts[:, :, :, BAD_KIND].sum(axis=2)
        return PulseCounts(self.switch, self.pulse_no, ip, bad, start_ns=start_ns, end_ns=last_ns,
                           start_time=wall_of(start_ns), end_time=wall_of(last_ns), merged=merged,
                           data=pkts[:, :, :, DATA_KIND].copy(), dup=dup)


def testbed_reader(tb, switch: str) -> PulseReader:
    """The reader of one testbed switch's pinned maps (``tb``: a netns_testbed.state.Testbed)."""
    return PulseReader(switch, tb.state.gap_ms, lambda: tb.maps(switch, readonly=True))   # it only reads
