"""An open incident's cost, live (agent.faultcost): the seconds to detect, name and drain from the onset,
and the switch's pulse rhythm and resent segments before, during and after the drain, on a synthetic
stream with known truth."""
from __future__ import annotations

import numpy as np

from agent.faultcost import PulseLog, incident_costs
from agent.incidents import IncidentTracker
from agent.pulse import SPAN_FIELDS, SPAN_RESENT
from netns_testbed.topo import Fabric, FabricSpec


def span(resent: int) -> np.ndarray:
    s = np.zeros((2, 3, len(SPAN_FIELDS)), dtype=np.int64)
    s[1, 2, SPAN_RESENT] = resent
    return s


def test_known_rhythm_and_resends_per_phase():
    """Iterations of 0.10 s with 2 resent segments each; from t=100 (the onset) 0.25 s with 40; the drain at
    t=110; from then 0.12 s with 3. The phases come out at those values, the pulse the drain crossed left
    out, and the seconds from the onset to the alert, the name and the drain as they happened."""
    fab = Fabric(FabricSpec())
    log = PulseLog()
    t = 40.0
    while t < 100.0:
        log.add(t, span(2))
        t += 0.10
    t = 100.0
    while t < 110.0:
        log.add(t, span(40))
        t += 0.25
    log.add(t, span(40))                 # the pulse the drain crosses (started before it)
    t += 0.5                             # ... and ended long after
    while t < 130.0:
        log.add(t, span(3))
        t += 0.12
    tr = IncidentTracker(fab, None)
    alert = {"event": "alert", "alert_id": "spine2/1/in/loss", "switch": "spine2", "port": 1,
             "link": "leaf1->spine2", "candidates": ["leaf1->spine2"], "kind": "loss", "estimated_rate": 0.02,
             "onset_time": 100.0, "time": 100.4, "pulse_start": 100.25}
    tr.feed(alert, now=100.4)
    actions = [{"event": "mitigation", "action": "drain", "link": "leaf1->spine2", "incident_id": "leaf1->spine2",
                "time": 110.1}]
    costs = incident_costs(tr.open(), tr.history, actions, {"spine2": log}, now=130.0)
    c = costs["leaf1->spine2"]
    assert c["switch"] == "spine2"
    assert abs(c["seconds"]["detect"] - 0.4) < 1e-9 and abs(c["seconds"]["name"] - 0.4) < 1e-9
    assert abs(c["seconds"]["drain"] - 10.1) < 1e-9
    ph = c["phases"]
    assert abs(ph["before"]["period_s"] - 0.10) < 1e-6 and ph["before"]["resent"] == 2
    assert abs(ph["during"]["period_s"] - 0.25) < 1e-6 and ph["during"]["resent"] == 40
    assert abs(ph["after_drain"]["period_s"] - 0.12) < 1e-6 and ph["after_drain"]["resent"] == 3


def test_a_localizing_incident_that_got_its_link_is_named_when_it_got_it():
    fab = Fabric(FabricSpec())
    tr = IncidentTracker(fab, None)
    loss = {"event": "alert", "alert_id": "leaf0/0/in/loss", "switch": "leaf0", "port": 0, "link": None,
            "candidates": ["spine0->leaf0", "leaf1->spine0"], "kind": "loss", "estimated_rate": 0.01,
            "onset_time": 50.0, "time": 50.5, "pulse_start": 50.3}
    tr.feed(loss, now=50.5)
    assert [i.state for i in tr.open()] == ["localizing"]
    c = incident_costs(tr.open(), tr.history, [], {}, now=51.0)["leaf1->spine0|spine0->leaf0"]
    assert c["seconds"]["name"] is None and c["seconds"]["drain"] is None and c["phases"] == {}
    # spine0 names its link (damaged frames): the leaf's loss joins it; the name counts from the same onset
    tr.feed({"event": "alert", "alert_id": "spine0/1/in/corruption", "switch": "spine0", "port": 1,
             "link": "leaf1->spine0", "candidates": ["leaf1->spine0"], "kind": "corruption",
             "estimated_rate": 0.01, "onset_time": 50.2, "time": 52.0, "pulse_start": 51.8}, now=52.0)
    c = incident_costs(tr.open(), tr.history, [], {}, now=53.0)["leaf1->spine0"]
    assert abs(c["seconds"]["detect"] - 0.5) < 1e-9 and abs(c["seconds"]["name"] - 2.0) < 1e-9
    assert c["switch"] == "leaf0"


def test_too_few_pulses_give_no_figure():
    log = PulseLog()
    log.add(10.0, None)
    ph = log.phases(onset=10.5, drained=None, now=11.0)
    assert ph["before"] == {"period_s": None, "resent": None} and ph["after_drain"]["period_s"] is None


def test_the_report_plots_what_the_fault_cost(tmp_path):
    """report.json's cost drawn (analysis.report.plot_cost): 10 iterations of 100 ms, the fault, 5 of 300 ms
    until the drain, then 110 ms; a PNG whose medians are the cost's; no plot for a run without a fault."""
    import matplotlib.image

    from analysis.cost import fault_cost
    from analysis.report import plot_cost

    t, its = 1000.0, []
    for i, d in enumerate([0.1] * 10 + [0.3] * 5 + [0.11] * 10):
        its.append({"index": i, "start": t, "end": t + d, "duration_s": d, "retrans_segs": 0})
        t += d + 0.05
    fault = {"link": "leaf1->spine0", "spec": "leaf1->spine0:drop=0.05", "start": its[10]["start"] - 0.01}
    actions = [{"action": "drain", "link": "leaf1->spine0", "time": its[15]["start"] - 0.01}]
    alerts = [{"time": its[10]["end"], "link": "leaf1->spine0", "candidates": ["leaf1->spine0"]}]
    cost = fault_cost(fault, its, alerts, [{"link": "leaf1->spine0", "time": its[11]["end"]}], actions)
    assert (cost["before_ms"], cost["during_ms"], cost["after_drain_ms"]) == (100.0, 300.0, 110.0)
    report = {"started": 999.0, "faults": [fault], "iterations": its, "cost": [cost]}
    out = plot_cost(tmp_path, report)
    assert out == tmp_path / "cost.png" and matplotlib.image.imread(out).shape[2] in (3, 4)
    assert plot_cost(tmp_path, {**report, "faults": [], "cost": []}) is None


def test_a_second_fault_on_the_same_link_is_timed_from_its_own_events():
    """The same link faulty twice: the second incident has the first's id, and its seconds to the name
    and the drain come from its own events (they came out as 0 live: the first incident's open and drain
    were taken). Updates of its alert do not move its detection."""
    fab = Fabric(FabricSpec())
    tr = IncidentTracker(fab, None)
    alert = {"event": "alert", "alert_id": "spine1/1/in/loss", "switch": "spine1", "port": 1,
             "link": "leaf1->spine1", "candidates": ["leaf1->spine1"], "kind": "loss", "estimated_rate": 0.02}
    tr.feed({**alert, "onset_time": 10.0, "time": 10.3}, now=10.3)
    tr.feed({**alert, "event": "resolved", "time": 20.0}, now=20.0)
    actions = [{"action": "drain", "link": "leaf1->spine1", "incident_id": "leaf1->spine1", "time": 10.31}]
    tr.feed({**alert, "onset_time": 100.0, "time": 100.5}, now=100.5)
    tr.feed({**alert, "event": "update", "onset_time": 100.0, "time": 104.0, "estimated_rate": 0.05}, now=104.0)
    actions.append({"action": "drain", "link": "leaf1->spine1", "incident_id": "leaf1->spine1", "time": 100.52})
    c = incident_costs(tr.open(), tr.history, actions, {}, now=105.0)["leaf1->spine1"]
    assert abs(c["seconds"]["detect"] - 0.5) < 1e-9 and abs(c["seconds"]["name"] - 0.5) < 1e-9
    assert abs(c["seconds"]["drain"] - 0.52) < 1e-9
