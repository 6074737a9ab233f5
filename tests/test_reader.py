"""The pulse reader's bookkeeping, with a stand-in for the pinned maps (no root)."""
from __future__ import annotations

import time

import numpy as np

from agent.reader import PulseReader


class FakeMaps:
    def __init__(self) -> None:
        self.c = np.zeros((6, 2, 6, 5, 2), np.int64)
        self.pid = 0
        self.last = 0
        self.race = False

    def pulse_state(self):
        return self.pid, self.last, self.last - 1000

    def counters(self):
        out = self.c.copy()
        if self.race:  # a packet is counted while we copy
            self.race = False
            self.c[0, 0, 1, 0, 0] += 1
            self.last += 1
        return out

    def dups(self):
        return np.zeros((6, 2, 2), np.int64)

    def identity(self):
        return 1

    def close(self):
        pass


def reader_with(maps: FakeMaps) -> PulseReader:
    return PulseReader("leaf0", 45.0, lambda: maps)


def traffic(m: FakeMaps, pkts: int, idle: bool = True) -> None:
    m.c[0, 0, 1, 0, 0] += pkts
    m.c[0, 0, 1, 0, 1] += pkts * 1500
    m.pid += 1
    m.last = time.monotonic_ns() - (int(100e6) if idle else 0)


def test_pulses_are_differences_of_idle_copies():
    m = FakeMaps()
    r = reader_with(m)
    traffic(m, 10)
    assert r.poll() is None            # first copy: the baseline, never a pulse
    traffic(m, 500)
    pc = r.poll()
    assert pc is not None and pc.ip[0, 0, 1] == 500 and pc.merged == 1
    assert r.poll() is None            # nothing new
    traffic(m, 100)
    traffic(m, 200)                    # two kernel pulses before the reader looked
    pc = r.poll()
    assert pc.ip[0, 0, 1] == 300 and pc.merged == 2


def test_mid_pulse_and_racing_copies_wait():
    m = FakeMaps()
    r = reader_with(m)
    traffic(m, 1)
    r.poll()
    traffic(m, 50, idle=False)         # still inside the pulse (last packet just now)
    assert r.poll() is None
    m.last = time.monotonic_ns() - int(100e6)
    m.race = True                      # a packet lands during the copy
    assert r.poll() is None
    m.last = time.monotonic_ns() - int(100e6)
    assert r.poll().ip[0, 0, 1] == 51


def test_counter_reset_resynchronises_without_a_pulse():
    m = FakeMaps()
    r = reader_with(m)
    traffic(m, 1000)
    r.poll()
    m.c[:] = 0                         # program reloaded: counters start again
    traffic(m, 7)
    assert r.poll() is None and r.resyncs == 1
    traffic(m, 40)
    assert r.poll().ip[0, 0, 1] == 40


def test_port_added_resynchronises():
    m = FakeMaps()
    r = reader_with(m)
    traffic(m, 100)
    r.poll()
    traffic(m, 100)
    assert r.poll() is not None
    m.c = np.zeros((7, 2, 6, 5, 2), np.int64)  # the switch got a port: new shape
    traffic(m, 30)
    assert r.poll() is None                    # baseline again, no bogus pulse
    traffic(m, 60)
    pc = r.poll()
    assert pc.ip.shape[0] == 7 and pc.ip[0, 0, 1] == 60


def test_detector_rebuilt_for_new_port_count():
    """The agent rebuilds its detector when the switch's port count changes (no crash)."""
    from agent.daemon import SwitchAgent
    from agent.detector import DetectorConfig, SwitchDetector
    from agent.pulse import PulseCounts
    from netns_testbed.topo import Fabric, FabricSpec

    agent = SwitchAgent.__new__(SwitchAgent)
    fab = Fabric(FabricSpec())
    agent.detector = SwitchDetector(fab, "leaf0", DetectorConfig())
    agent._make_detector = lambda: SwitchDetector(Fabric(FabricSpec(hosts_per_leaf=3)), "leaf0", DetectorConfig())
    agent.switch, agent.pulses, agent._rec, agent.sinks, agent.alerts_total, agent.busy_s = "leaf0", 0, None, [], {}, 0.0
    agent.opts = type("O", (), {"persist": False, "save_every": 10, "export_verdicts": False})()
    pc = PulseCounts("leaf0", 1, np.zeros((7, 2, 6), np.int64), np.zeros((7, 2), np.int64))
    agent.reader = type("R", (), {"poll": lambda self: pc})()
    assert agent.step() == [] and agent.detector.nports == 7


def test_pulse_id_wrap_neither_skips_the_idle_check_nor_counts_backwards():
    m = FakeMaps()
    r = reader_with(m)
    m.pid = (1 << 24) - 1                 # the last id before the wrap
    m.last = time.monotonic_ns() - int(100e6)
    assert r.poll() is None               # baseline
    m.c[0, 0, 1, 0, 0] += 300
    m.pid = 0                             # wrapped, and a packet a moment ago: mid-pulse
    m.last = time.monotonic_ns()
    assert r.poll() is None
    m.last -= int(100e6)                  # now idle
    pc = r.poll()
    assert pc is not None and pc.merged == 1 and pc.ip[0, 0, 1] == 300
    assert pc.pulse == 1 << 24            # the reader's number goes on past the kernel's 24 bits


def test_pulse_numbers_never_go_back_across_a_reset():
    m = FakeMaps()
    r = reader_with(m)
    traffic(m, 10)
    r.poll()                               # baseline at kernel id 1
    numbers = []
    for _ in range(3):
        traffic(m, 100)
        numbers.append(r.poll().pulse)
    m.c[:] = 0                             # the maps were replaced (a reload): counters and id restart
    m.pid = 0
    assert r.poll() is None and r.resyncs == 1
    for _ in range(2):
        traffic(m, 100)
        numbers.append(r.poll().pulse)
    assert numbers == [2, 3, 4, 5, 6], numbers
