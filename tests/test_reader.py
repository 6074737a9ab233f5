"""The pulse reader's bookkeeping over the kernel's ring of pulses, with a stand-in for the maps (no root)."""
from __future__ import annotations

import time

import numpy as np

from agent.reader import PulseReader
from netns_testbed.datapath import PulseSlot, _is_newer


MOD = 1 << 24


class FakeRing:
    """The kernel's side as the reader sees it: a pulse word, and a ring of per-pulse slots."""

    ring = 4

    def __init__(self, nports: int = 6) -> None:
        self.nports = nports
        self.pid = 0
        self.last = 0
        self.slots: dict[int, list] = {}
        self.ident = 1
        self.during_copy = None

    def pulse(self, pkts: int, idle: bool = True) -> None:
        """One whole kernel pulse of ``pkts`` packets (leaf1's data on port 0, in)."""
        old = self.slots.get(self.pid % self.ring)
        if old is not None and old[0] == self.pid:
            old[3] = self.last
        self.pid = (self.pid + 1) % MOD
        self.last = time.monotonic_ns() - (int(100e6) if idle else 0)
        c = np.zeros((self.nports, 2, 6, 5), np.int64)
        c[0, 0, 1, 0] = pkts
        self.slots[self.pid % self.ring] = [self.pid, c, self.last - 1000, 0]

    def more(self, pkts: int) -> None:
        """Packets added to the open pulse just now."""
        self.slots[self.pid % self.ring][1][0, 0, 1, 0] += pkts
        self.last = time.monotonic_ns()

    def pulse_state(self):
        return self.pid, self.last, self.last - 1000

    def read_pulse(self, p: int) -> PulseSlot:
        s = self.slots.get(p % self.ring)
        if s is not None and s[0] == p:
            got = PulseSlot(p, s[1].copy(), np.zeros((self.nports, 2, 2), np.int64), s[2], s[3], False)
        else:
            got = PulseSlot(p, np.zeros((self.nports, 2, 6, 5), np.int64), np.zeros((self.nports, 2, 2), np.int64),
                            0, 0, s is not None and _is_newer(s[0], p))
        if self.during_copy:
            f, self.during_copy = self.during_copy, None
            f()
        return got

    def identity(self):
        return self.ident

    def close(self):
        pass


def reader_with(m: FakeRing) -> PulseReader:
    return PulseReader("leaf0", 45.0, lambda: m)


def drain(r: PulseReader) -> list:
    out = []
    while (pc := r.poll()) is not None:
        out.append(pc)
    return out


def test_every_pulse_comes_whole_and_alone_however_late_the_reader():
    m = FakeRing()
    r = reader_with(m)
    assert r.poll() is None                     # no packet yet: it will start at the first pulse
    m.pulse(10)
    m.pulse(20)
    first = drain(r)
    assert [pc.ip[0, 0, 1] for pc in first] == [10, 20]
    for k in (100, 200, 300):                  # three pulses before the reader looks again
        m.pulse(k)
    got = drain(r)
    assert [pc.ip[0, 0, 1] for pc in got] == [100, 200, 300]
    assert [pc.merged for pc in got] == [1, 1, 1]
    assert [pc.pulse for pc in first + got] == [1, 2, 3, 4, 5]
    assert r.lost == 0 and r.poll() is None


def test_the_open_pulse_waits_for_the_gap_and_a_racing_copy_is_taken_again():
    m = FakeRing()
    r = reader_with(m)
    m.pulse(50, idle=False)                    # a packet just now: still open
    assert r.poll() is None
    m.last -= int(100e6)                       # idle now
    m.during_copy = lambda: m.more(1)          # a packet lands while it is copied
    assert r.poll() is None
    m.last -= int(100e6)
    pc = r.poll()
    assert pc.ip[0, 0, 1] == 51 and pc.pulse == 1


def test_a_reader_a_whole_ring_behind_says_how_many_pulses_it_lost(caplog):
    m = FakeRing()
    r = reader_with(m)
    m.pulse(1)
    assert len(drain(r)) == 1
    for k in range(2, 9):                      # 7 pulses (2..8), the ring keeps 4
        m.pulse(k)
    with caplog.at_level("ERROR"):
        got = drain(r)
    assert [pc.ip[0, 0, 1] for pc in got] == [5, 6, 7, 8]
    assert r.lost == 3 and "3 pulse(s) lost" in caplog.text
    assert [pc.pulse for pc in got] == [5, 6, 7, 8]     # numbers count the lost ones too


def test_a_slot_reused_during_its_copy_is_lost_not_misread():
    m = FakeRing()
    r = reader_with(m)
    m.pulse(1)
    drain(r)
    for k in range(2, 6):                      # pulses 2..5: the ring is full, 2 is next
        m.pulse(k)
    m.during_copy = lambda: m.pulse(6)         # pulse 6 takes slot 2 while 2 is copied
    assert r.poll() is None and r.lost == 1
    assert [pc.ip[0, 0, 1] for pc in drain(r)] == [3, 4, 5, 6]


def test_an_id_that_goes_back_resynchronises_and_numbers_go_on():
    m = FakeRing()
    r = reader_with(m)
    for k in (10, 20):                         # the reader starts at the pulse under way: only 20
        m.pulse(k)
    numbers = [pc.pulse for pc in drain(r)]
    assert numbers == [2]
    m.pid, m.slots = 0, {}                     # the maps were reset: the id starts again
    m.pulse(30)
    got = drain(r)
    assert r.resyncs == 1 and [pc.ip[0, 0, 1] for pc in got] == [30]
    assert [pc.pulse for pc in got] == [3]


def test_replaced_maps_are_reopened_and_numbers_go_on():
    m = FakeRing()
    r = reader_with(m)
    m.pulse(10)
    drain(r)
    m2 = FakeRing(nports=7)                    # a reload: new maps, a port more, the id from 0
    m2.ident = 2
    r.open_maps = lambda: m2
    m.ident = 2
    m2.pulse(40)
    got = drain(r)
    assert r.resyncs == 1 and [pc.ip.shape[0] for pc in got] == [7] and got[0].pulse == 2


def test_detector_rebuilt_for_new_port_count():
    """The agent rebuilds its detector when the switch's port count changes (no crash)."""
    from agent.daemon import SwitchAgent
    from agent.detector import DetectorConfig, SwitchDetector
    from agent.faultcost import PulseLog
    from agent.pulse import PulseCounts
    from netns_testbed.topo import Fabric, FabricSpec

    agent = SwitchAgent.__new__(SwitchAgent)
    fab = Fabric(FabricSpec())
    agent.detector = SwitchDetector(fab, "leaf0", DetectorConfig())
    agent._make_detector = lambda: SwitchDetector(Fabric(FabricSpec(hosts_per_leaf=3)), "leaf0", DetectorConfig())
    agent.switch, agent.pulses, agent._rec, agent.sinks, agent.alerts_total, agent.busy_s = "leaf0", 0, None, [], {}, 0.0
    agent.opts = type("O", (), {"persist": False, "save_every": 10, "export_verdicts": False})()
    agent.dep = type("D", (), {"spray_changes": None})()         # no spray changes to follow
    agent.change_seen = None
    agent.pulse_log = PulseLog()
    pc = PulseCounts("leaf0", 1, np.zeros((7, 2, 6), np.int64), np.zeros((7, 2), np.int64))
    pending = [pc]
    agent.reader = type("R", (), {"poll": lambda self: pending.pop() if pending else None})()
    assert agent.step() == [] and agent.detector.nports == 7 and agent.pulses == 1
    assert agent.step() == [] and agent.pulses == 1


def test_pulse_id_wrap_numbers_go_on_past_24_bits():
    m = FakeRing()
    r = reader_with(m)
    m.pid = MOD - 2
    m.pulse(1)                                 # id 2^24 - 1
    assert [pc.pulse for pc in drain(r)] == [MOD - 1]
    m.pulse(300)                               # id 0 after the wrap
    m.pulse(301)
    got = drain(r)
    assert [pc.ip[0, 0, 1] for pc in got] == [300, 301]
    assert [pc.pulse for pc in got] == [MOD, MOD + 1]


def test_a_reader_armed_during_a_burst_skips_the_pulses_it_saw_in_part():
    """Counting armed on every port at ``armed_ns`` (a site agent attached port after port during a job):
    a pulse that began before a whole gap had passed since then holds part of a burst and is skipped; the
    first one after is given, and every one after it."""
    m = FakeRing()
    armed = time.monotonic_ns()

    def pulse(pkts: int, start_ns: int, idle: bool = True) -> None:
        m.pulse(pkts, idle=idle)
        m.slots[m.pid % m.ring][2] = start_ns

    pulse(100, armed - 1000, idle=False)       # under way when counting was armed
    r = PulseReader("leaf0", 45.0, lambda: m, armed_ns=armed)
    assert r.poll() is None                    # still open
    pulse(200, armed + int(20e6))              # began after arming, but within a gap of it: the gap before
    pulse(300, armed + int(60e6))              # it was not all seen; this one's was
    pulse(400, armed + int(80e6))
    got = drain(r)
    assert [int(pc.ip[0, 0, 1]) for pc in got] == [300, 400]
    assert r.skipped == 2 and r.lost == 0 and [pc.pulse for pc in got] == [3, 4]
    pulse(500, armed - int(1e9))               # once whole pulses came, the rule is done with
    assert [int(pc.ip[0, 0, 1]) for pc in drain(r)] == [500]


def test_a_reader_of_counters_that_ran_all_along_skips_nothing():
    m = FakeRing()
    m.pulse(100)
    m.pulse(200)
    r = reader_with(m)                         # a testbed's counters: running since the build
    m.pulse(300)
    assert [int(pc.ip[0, 0, 1]) for pc in drain(r)] == [300] and r.skipped == 0
