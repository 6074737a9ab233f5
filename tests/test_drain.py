"""Drains and restores: the refusals (the fabric model), and detectors that take the new shares at the
moment the spray tables switched, on counter-model streams with known truth.

Each stream's pulses carry kernel times (100 ms apart, 50 ms long); the drain's window falls inside
one pulse, which therefore holds packets sprayed both ways (the model sums an old-share and a
new-share half-pulse for it)."""
from __future__ import annotations

import dataclasses

import pytest

from agent.detector import DetectorConfig, SwitchDetector
from agent.pulse import PulseCounts, merge
from analysis.model import FabricModel, ModelSpec
from netns_testbed.errors import SpecError, StateError
from netns_testbed.topo import Fabric, FabricSpec, Link

PULSE_NS = 100_000_000


def _timed(pcs: dict[str, PulseCounts], i: int) -> dict[str, PulseCounts]:
    return {sw: dataclasses.replace(pc, start_ns=i * PULSE_NS + 1, end_ns=i * PULSE_NS + PULSE_NS // 2)
            for sw, pc in pcs.items()}


def _mixed(model: FabricModel, oos: list[Link], i: int, weights: dict | None = None) -> dict[str, PulseCounts]:
    """One pulse in which the leaves switched tables halfway: half an iteration each way."""
    model.pkts //= 2
    before = model.step()
    model.set_out_of_service(oos, weights)
    after = model.step()
    model.pkts = int(model.pkts * 2)
    model.pulse -= 1
    return _timed({sw: merge([before[sw], after[sw]]) for sw in before}, i)


def _stream(spec: ModelSpec, drain_at: int, pulses: int, drained: list[str], tell, faults: dict | None = None,
            weights: dict | None = None):
    """Alerts of every switch's detector over a stream whose leaves drain ``drained`` in pulse ``drain_at``.
    ``tell(dets, oos, t0, t1)`` is what the detectors hear of the change, and when (see the tests)."""
    model = FabricModel(spec)
    fab = model.fabric
    dets = {sw: SwitchDetector(fab, sw, DetectorConfig(), spec.spray) for sw in fab.switches}
    oos = fab.parse_link_list(drained)
    t0, t1 = drain_at * PULSE_NS + PULSE_NS // 4, drain_at * PULSE_NS + PULSE_NS // 4 + 2_000_000
    if faults:
        model.set_faults(faults)
    events = []
    held = []
    for i in range(pulses):
        pcs = _mixed(model, oos, i, weights) if i == drain_at else _timed(model.step(), i)
        held.append(pcs)
        if tell.early is not None and i == tell.early:
            tell(dets, oos, t0, t1, weights)
        if i < tell.lag_until:
            continue                           # an agent that is behind: it reads these pulses later
        if i == drain_at and tell.early is None:
            tell(dets, oos, t0, t1, weights)
        for p in held:
            for sw, pc in p.items():
                events += [(sw, e) for e in dets[sw].observe(pc) if e.event == "alert"]
        held = []
    return events, dets


class Tell:
    """How a detector hears of the change: ``early`` (a pulse index: right then, before reading it and
    the ones it has not read yet), ``lag_until`` (pulses before this one are read only then)."""

    def __init__(self, reshare: bool = True, early: int | None = None, lag_until: int = 0) -> None:
        self.reshare, self.early, self.lag_until = reshare, early, lag_until

    def __call__(self, dets, oos, t0, t1, weights=None) -> None:
        if self.reshare:
            for d in dets.values():
                d.reshare(oos, t0, t1, weights)


SPEC = ModelSpec(fabric=FabricSpec(4, 4, 2), seed=3)


@pytest.mark.parametrize("drained", [["spine1->leaf2"], ["leaf0->spine3"], ["leaf1<->spine0"]])
def test_a_drain_under_traffic_raises_no_alert(drained):
    events, dets = _stream(SPEC, 20, 60, drained, Tell())
    assert events == []
    assert all(d.skipped <= 1 for d in dets.values())
    assert sum(d.skipped for d in dets.values()) >= 1      # the mixed pulse was seen and left out


@pytest.mark.parametrize("weight", [0.25, 0.1])
def test_a_canary_weight_under_traffic_raises_no_alert(weight):
    """An uplink's weight cut to a canary share (the mitigation's first step on an ambiguous alert)."""
    events, dets = _stream(SPEC, 20, 60, [], Tell(), weights={"leaf1->spine2": weight})
    assert events == []
    assert dets["leaf2"].checks[0].shares()[1, 2] == pytest.approx(weight / (3 + weight))


def test_without_the_new_shares_the_same_drain_alarms():
    """The control: a detector that keeps the old shares reads the drained spine's missing traffic as
    a loss (this test fails if the stream were too gentle to show anything)."""
    events, _ = _stream(SPEC, 20, 40, ["spine1->leaf2"], Tell(reshare=False))
    assert events


def test_pulses_read_late_are_judged_by_the_shares_of_their_time():
    """The agent hears of the drain before it reads the ten pulses that were sprayed before it."""
    events, _ = _stream(SPEC, 20, 60, ["spine1->leaf2"], Tell(early=25, lag_until=25))
    assert events == []


class TellTwice(Tell):
    """As an agent that read the state while the leaves were still switching (the change's end not yet
    written: ``t1`` None), then again with its end (agent.daemon's follow_changes tells both)."""

    def __call__(self, dets, oos, t0, t1, weights=None) -> None:
        for d in dets.values():
            d.reshare(oos, t0, None, weights)
            d.reshare(oos, t0, t1, weights)


def test_a_change_told_while_switching_and_again_with_its_end_is_judged_from_its_end_on():
    """The change told again replaces itself (the shares tuple's window start is what identifies it):
    only the crossed pulse is left out. Comparing the wrong field kept the open-ended copy at the head
    of the queue, and every pulse after the drain was skipped: detection stopped for good."""
    events, dets = _stream(SPEC, 20, 60, ["spine1->leaf2"], TellTwice())
    assert events == []
    assert all(d.skipped <= 1 and not d.changes for d in dets.values()), {sw: d.skipped for sw, d in dets.items()}


def test_a_drained_faulty_link_keeps_its_alert_open_and_nothing_else_alarms():
    spec = dataclasses.replace(SPEC, seed=5)
    model = FabricModel(spec)
    fab = model.fabric
    dets = {sw: SwitchDetector(fab, sw, DetectorConfig(), spec.spray) for sw in fab.switches}
    oos = fab.parse_link_list(["leaf2->spine1"])
    model.set_faults({"leaf2->spine1": 0.02})
    alerts, opened = [], set()
    for i in range(50):
        if i == 10:
            pcs = _mixed(model, oos, i)
            for d in dets.values():
                d.reshare(oos, i * PULSE_NS + PULSE_NS // 4, i * PULSE_NS + PULSE_NS // 4 + 1_000_000)
        else:
            pcs = _timed(model.step(), i)
        for sw, pc in pcs.items():
            for e in dets[sw].observe(pc):
                if e.event == "alert":
                    alerts.append((i, e))
                    opened.add(e.alert_id)
    before = [e for i, e in alerts if i < 10]
    after = [e for i, e in alerts if i > 10]
    assert before and any(e.link == "leaf2->spine1" or "leaf2->spine1" in e.candidates for e in before)
    assert after == [], [(e.switch, e.link, e.candidates) for e in after]
    still = {aid for d in dets.values() for aid in d.book.open}
    assert still & opened                         # the drained link's alert stays open: it was not repaired


def test_check_drain_refuses_host_links_and_cut_off_leaves():
    fab = Fabric(FabricSpec(2, 2, 1))
    with pytest.raises(SpecError, match="host link"):
        fab.check_drain([], [Link("h0", "leaf0")])
    fab.check_drain([], fab.parse_link_list(["leaf0<->spine1"]))
    with pytest.raises(StateError, match="0 spine"):
        fab.check_drain(fab.parse_link_list(["leaf0->spine1"]), [Link("spine0", "leaf1")])
    with pytest.raises(StateError, match="floor of 2"):
        fab.check_drain([], [Link("leaf1", "spine0")], min_spines=2)
    with pytest.raises(SpecError, match="min-spines 0"):
        fab.check_drain([], [], min_spines=0)


def test_an_agent_that_started_before_any_change_takes_every_change_it_finds():
    """agent.daemon's follow_changes: an agent that found no change at start and then two at once (a
    canary and a drain between two of its looks) tells its detector both, in order; one that started
    with changes recorded takes the latest alone (its detector was built with those shares)."""
    from types import SimpleNamespace

    from agent.daemon import SwitchAgent
    from netns_testbed.topo import SprayChange

    link = Link("leaf0", "spine1")
    canary = SprayChange(1, "weight", (link,), (), 10, 20, (("leaf0->spine1", 0.25),))
    drain = SprayChange(2, "drain", (link,), (link,), 30, 40, (("leaf0->spine1", 0.25),))
    recorded: list = []
    told = []
    agent = SimpleNamespace(dep=SimpleNamespace(spray_changes=lambda: recorded), switch="leaf1", change_seen=None,
                            detector=SimpleNamespace(take=lambda chg: told.append(chg.t0_ns)))
    SwitchAgent.follow_changes(agent)
    recorded += [canary, drain]
    SwitchAgent.follow_changes(agent)
    assert told == [10, 30]
    late = SimpleNamespace(dep=agent.dep, switch="leaf1", change_seen=None, detector=agent.detector)
    told.clear()
    SwitchAgent.follow_changes(late)
    assert told == [30]
