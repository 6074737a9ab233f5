"""A switch's pulses, one by one, from the kernel's ring of per-pulse counters.

The kernel program stamps every IPv4 packet and opens a new pulse after an idle
gap (``gap_ms``), so pulse boundaries come from the traffic itself with packet
timing, not from this reader. Each pulse counts into its own ring slot (its
counters tagged with its id, bpf/switch.h), so the reader copies a pulse whole
whenever it gets to it: a reader that is late, a busy machine, a poll that
sleeps through several pulses lose nothing and never merge two pulses, until
the ring (``datapath.RING`` pulses) has gone round; then the pulses it missed
are counted as lost and logged as an error.

The open pulse is read once it has been idle for the gap; if a packet lands
while it is copied (its last-packet time moved) the copy is thrown away and
taken again at the next poll. Maps that were replaced (a reload) are reopened,
and an id that goes backwards (a reset) starts again at the current pulse.

Counting that begins while traffic flows (a site agent loads its program and
attaches it port after port, during a job) sees its first pulses in part: some
ports counted from the burst's start, others from when they were attached, and
the first "pulse" begins wherever counting began. A reader told when counting was
armed on every port (``armed_ns``) gives only pulses whose opening gap of silence
it observed whole: a pulse starts after ``gap_ms`` without a packet, so a pulse
that started at least ``gap_ms`` after every port counted is whole. The ones before
are skipped (``skipped``), not judged. A testbed's counters run from its build:
its readers are never partial.

Between pulses the reader has nothing to do. The kernel says when a pulse opens
(a record in the ``pulse_events`` ring buffer, :attr:`wake_fd`, which epoll
reports readable); while one is open the reader knows when to look again (its
last packet's time plus the gap, :attr:`wake_ns`). So an agent sleeps until one
of the two (``agent.daemon.run_agents``), and polls the clock only for a program
without the ring (a testbed built by an older version).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from agent.pulse import PulseCounts
from netns_testbed.datapath import KINDS, PULSE_ID_BITS

log = logging.getLogger("flowpulse.agent.reader")
IP_KINDS = [KINDS.index(k) for k in ("tcp_data", "tcp_ctrl", "other_ip")]   # IPv4 with a good header
DATA_KIND = KINDS.index("tcp_data")
BAD_KIND = KINDS.index("bad_hdr")
PULSE_ID_MOD = 1 << PULSE_ID_BITS


def wall_of(mono_ns: int) -> float:
    """Monotonic ns (what bpf_ktime_get_ns stamps) to Unix time."""
    return time.time() - (time.monotonic_ns() - mono_ns) / 1e9


class PulseReader:
    """Yields :class:`PulseCounts` of one switch, one per kernel pulse, as its pulses close.

    ``open_maps`` returns the switch's counter maps (a :class:`netns_testbed.datapath.CounterMaps`:
    ``pulse_state()``, ``read_pulse(id)``, ``ring``, ``identity()`` (changes when the maps are
    replaced, e.g. by a reload; None if they cannot be) and ``close()``): the testbed's pinned maps
    (:func:`testbed_reader`) or the counting program a site agent loaded itself (``agent.counting``).

    The pulse numbers it gives (``PulseCounts.pulse``) are 64-bit and never go back: the kernel's
    id is 24 bits (it shares one atomic word with the last packet's time); the reader counts on
    from the first id it saw, one per pulse given or lost, across wraps, reloads and resets.
    """

    def __init__(self, switch: str, gap_ms: float, open_maps: Callable[[], object], margin_ms: float = 5.0,
                 armed_ns: int | None = None) -> None:
        self.switch = switch
        self.gap_ns = int((gap_ms + margin_ms) * 1e6)
        # pulses that started before this (monotonic ns) began while counting was being armed: skipped
        self.whole_from_ns = None if armed_ns is None else armed_ns + int(gap_ms * 1e6)
        self.skipped = 0
        # when to look again (monotonic ns): the open pulse's last packet plus the gap; None: no pulse is
        # open, nothing to do until the kernel says one opened (wake_fd)
        self.wake_ns: int | None = None
        self._durations: deque[int] = deque(maxlen=8)   # the latest pulses' lengths (ns)
        self.open_maps = open_maps
        self.maps = None
        self._pin_ino = None
        self.next_id: int | None = None     # the kernel's id of the next pulse to give
        self.pulse_no: int | None = None    # the 64-bit number that pulse will carry
        self.resyncs = 0
        self.reads = 0
        self.lost = 0                       # pulses the ring overwrote before this reader got to them
        self._open()

    def _pin_identity(self):
        return self.maps.identity()

    def _open(self) -> None:
        if self.maps is not None:
            self.maps.close()
        self.maps = self.open_maps()
        self._pin_ino = self._pin_identity()
        self.next_id = None

    def close(self) -> None:
        if self.maps is not None:
            self.maps.close()
            self.maps = None

    @property
    def wake_fd(self) -> int | None:
        """A descriptor epoll reports readable when a pulse opens (None: the maps have no such ring)."""
        w = getattr(self.maps, "wakeups", None)
        return w.fileno() if w is not None else None

    def woken(self) -> None:
        """After a wake: re-arm the ring (its records are not needed)."""
        w = getattr(self.maps, "wakeups", None)
        if w is not None:
            w.drain()

    def _skip(self, n: int, why: str) -> None:
        log.error("%s: %d pulse(s) lost: %s (the kernel keeps %d; poll more often or give the agent "
                  "more CPU)", self.switch, n, why, self.maps.ring)
        self.lost += n
        self.pulse_no += n
        self.next_id = (self.next_id + n) % PULSE_ID_MOD

    def _partial(self, start_ns: int) -> None:
        log.info("%s: pulse begun %.0f ms before counting ran on every port for a whole gap: skipped (it "
                 "holds part of a burst)", self.switch, (self.whole_from_ns - start_ns) / 1e6)
        self.skipped += 1
        self.pulse_no += 1
        self.next_id = (self.next_id + 1) % PULSE_ID_MOD

    def poll(self) -> PulseCounts | None:
        """The next closed pulse not given yet, else None. Cheap when idle; call it until it
        returns None to catch up after a pause."""
        assert self.maps is not None
        try:
            if self._pin_identity() != self._pin_ino:
                log.warning("%s: datapath maps were replaced (reload): resynchronising", self.switch)
                self.resyncs += 1
                self._open()
        except FileNotFoundError:
            raise RuntimeError(f"{self.switch}: the datapath's maps are gone (testbed down?)") from None
        pid, last_ns, start_ns = self.maps.pulse_state()
        self.wake_ns = None
        if pid == 0 and last_ns == 0:         # no IPv4 packet yet: the first pulse will be id 1
            if self.next_id is None:
                self.next_id = 1
                self.pulse_no = 1 if self.pulse_no is None else self.pulse_no
            return None
        if self.next_id is None:
            self.next_id = pid                # the pulse under way (or just over) is whole in its slot
            if self.pulse_no is None:
                self.pulse_no = pid
        pending = (pid + 1 - self.next_id) % PULSE_ID_MOD    # pulses not given yet, the current one included
        if pending == 0:
            return None                       # every pulse so far given; the next has not begun
        if pending > PULSE_ID_MOD // 2:
            log.warning("%s: the kernel's pulse id went back (maps reset): resynchronising", self.switch)
            self.resyncs += 1
            self.next_id, pending = pid, 1
        ahead = pending - 1                   # closed pulses before the current one
        if ahead >= self.maps.ring:
            self._skip(ahead - self.maps.ring + 1, f"the reader was {ahead} pulses behind")
            ahead = self.maps.ring - 1
        if ahead == 0 and time.monotonic_ns() - last_ns < self.gap_ns:
            # look again when it can have closed: a gap after its last packet, and not before a pulse as
            # long as the usual one has gone by (a collective's pulses are alike: one look, not one a gap)
            self.wake_ns = max(last_ns, start_ns + self._usual_ns()) + self.gap_ns
            return None                       # the current pulse is still open
        got = self.maps.read_pulse(self.next_id)
        self.reads += 1
        pid2, last2, _ = self.maps.pulse_state()
        if ahead == 0 and pid2 == pid and last2 != last_ns:
            self.wake_ns = last2 + self.gap_ns
            return None                       # a packet extended the pulse during the copy: again later
        if got.overwritten or (pid2 - self.next_id) % PULSE_ID_MOD >= self.maps.ring:
            self._skip(1, "its ring slot was reused while it was copied")
            return None
        start = got.start_ns or (start_ns if ahead == 0 else 0)
        end = got.end_ns or (last_ns if ahead == 0 else start)
        if self.whole_from_ns is not None:
            if start < self.whole_from_ns:
                self._partial(start)
                return self.poll()            # the next one, if it closed too (at most the ring's pulses)
            self.whole_from_ns = None         # from here on every pulse is whole
        pkts = got.counts
        pc = PulseCounts(self.switch, self.pulse_no, pkts[:, :, :, IP_KINDS].sum(axis=3),
                         pkts[:, :, :, BAD_KIND].sum(axis=2), start_ns=start, end_ns=end,
                         start_time=wall_of(start), end_time=wall_of(end), merged=1,
                         data=pkts[:, :, :, DATA_KIND].copy(), dup=got.dups, span=got.spans)
        self.pulse_no += 1
        self.next_id = (self.next_id + 1) % PULSE_ID_MOD
        if end > start:
            self._durations.append(end - start)
        return pc

    def _usual_ns(self) -> int:
        """The median length of the latest pulses (0 before any): when to look at an open pulse first."""
        if not self._durations:
            return 0
        return sorted(self._durations)[len(self._durations) // 2]


def testbed_reader(tb, switch: str) -> PulseReader:
    """The reader of one testbed switch's pinned maps (``tb``: a netns_testbed.state.Testbed)."""
    return PulseReader(switch, tb.state.gap_ms, lambda: tb.maps(switch, readonly=True))   # it only reads
