"""The mitigation policy (agent.mitigation) on incident event sequences, against a fake fabric that
applies the testbed's own refusals (Fabric.check_drain)."""
from __future__ import annotations

import pytest

from agent.mitigation import CANARY_WEIGHT, MitigationPolicy, Mitigator
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec, Link

FABRIC = Fabric(FabricSpec(4, 4, 2))


class FakeFabric:
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.out: set[str] = set()
        self.weights: dict[str, float] = {}
        self.calls: list[tuple] = []

    def drain(self, links: list[Link], min_spines: int) -> None:
        self.fabric.check_drain(self.fabric.links_named(self.out), links, min_spines)
        self.out |= {l.name for l in links}
        self.calls.append(("drain", *[l.name for l in links]))

    def restore(self, links: list[Link]) -> None:
        self.out -= {l.name for l in links}
        self.calls.append(("restore", *[l.name for l in links]))

    def weigh(self, link: Link, weight: float) -> None:
        if weight == 1.0:
            self.weights.pop(link.name, None)
        else:
            self.weights[link.name] = weight
        self.calls.append(("weigh", link.name, weight))

    def drained(self) -> set[str]:
        return set(self.out)


def inc(event: str, iid: str, link: str | None = None, candidates=(), kind="loss", previous_id=None) -> dict:
    d = {"event": event, "incident_id": iid, "link": link, "candidates": list(candidates) or [link], "kind": kind,
         "state": "resolved" if event == "resolved" else "localized" if link else "localizing"}
    if previous_id:
        d["previous_id"] = previous_id
    return d


def actions(evs: list[dict]) -> list[tuple[str, str]]:
    return [(e["action"], e["link"]) for e in evs]


def test_named_at_once_is_drained_and_stays_drained():
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab)
    assert actions(m.on_incident(inc("open", "leaf1->spine2", "leaf1->spine2"))) == [("drain", "leaf1->spine2")]
    assert m.on_incident(inc("update", "leaf1->spine2", "leaf1->spine2")) == []
    assert m.on_incident(inc("resolved", "leaf1->spine2", "leaf1->spine2")) == []   # only an operator restores it
    assert fab.out == {"leaf1->spine2"}


@pytest.mark.parametrize("named", ["leaf0->spine1", "spine1->leaf2"])
def test_localizing_holds_a_canary_then_drains_the_named_one_and_lifts_the_canary(named):
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab)
    lid = "leaf0->spine1|spine1->leaf2"
    cands = ["spine1->leaf2", "leaf0->spine1"]
    assert actions(m.on_incident(inc("open", lid, None, cands))) == [("canary", "leaf0->spine1")]
    assert fab.weights == {"leaf0->spine1": CANARY_WEIGHT} and fab.out == set()
    assert m.on_incident(inc("update", lid, None, cands)) == []                      # not twice
    got = actions(m.on_incident(inc("localized", named, named, previous_id=lid)))
    assert got == [("drain", named), ("canary_lifted", "leaf0->spine1")]
    assert fab.out == {named} and fab.weights == {}                                   # nothing innocent left out


def test_a_localizing_incident_that_resolves_gives_everything_back():
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab)
    lid = "leaf3->spine0|spine0->leaf1"
    m.on_incident(inc("open", lid, None, ["spine0->leaf1", "leaf3->spine0"]))
    assert actions(m.on_incident(inc("resolved", lid, None, ["spine0->leaf1", "leaf3->spine0"]))) == \
        [("canary_lifted", "leaf3->spine0")]
    assert fab.out == set() and fab.weights == {}


def test_refusals_change_nothing_and_are_reported():
    fab = FakeFabric(Fabric(FabricSpec(2, 2, 1)))
    m = Mitigator(fab.fabric, fab)
    assert actions(m.on_incident(inc("open", "leaf0->spine1", "leaf0->spine1"))) == [("drain", "leaf0->spine1")]
    ev = m.on_incident(inc("open", "spine0->leaf1", "spine0->leaf1"))                # the last spine to leaf1
    assert actions(ev) == [("refused", "spine0->leaf1")] and "0 spine" in ev[0]["reason"]
    assert fab.out == {"leaf0->spine1"}
    assert m.on_incident(inc("update", "spine0->leaf1", "spine0->leaf1")) == []          # said once
    fab.out.clear()                                                                       # an operator restores
    assert actions(m.on_incident(inc("update", "spine0->leaf1", "spine0->leaf1"))) == [("drain", "spine0->leaf1")]
    cap = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, cap, MitigationPolicy(max_per_switch=1))
    m.on_incident(inc("open", "leaf0->spine1", "leaf0->spine1"))
    ev = m.on_incident(inc("open", "spine1->leaf3", "spine1->leaf3"))                # spine1 is at its cap
    assert actions(ev) == [("refused", "spine1->leaf3")] and "spine1" in ev[0]["reason"]
    assert m.actions == {"drain": 1, "refused": 1}


def test_host_links_and_other_kinds_are_left_alone():
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab)
    assert m.on_incident(inc("open", "leaf0->h1", "leaf0->h1")) == []
    assert m.on_incident(inc("open", "x", "leaf0->spine1", kind="asymmetry")) == []
    assert fab.calls == []


def test_an_operator_restore_is_respected():
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab)
    m.on_incident(inc("open", "leaf2->spine3", "leaf2->spine3"))
    fab.out.clear()                                            # `flowpulse fabric restore leaf2->spine3`
    assert m.on_incident(inc("update", "leaf2->spine3", "leaf2->spine3")) == []   # not drained again for it
    assert m.drained() == {}
    m.on_incident(inc("resolved", "leaf2->spine3", "leaf2->spine3"))
    assert actions(m.on_incident(inc("open", "leaf2->spine3", "leaf2->spine3"))) == [("drain", "leaf2->spine3")]


def test_policy_bounds():
    with pytest.raises(SpecError):
        MitigationPolicy(max_per_switch=0).validate()
    with pytest.raises(SpecError):
        MitigationPolicy(min_spines=0).validate()
    for w in (0, 0.001, 1.5, float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(SpecError, match="--canary-weight"):
            MitigationPolicy(canary_weight=w).validate()


@pytest.mark.parametrize("weight", [0.5, 0.01])
def test_the_canary_takes_the_policys_weight(weight):
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab, MitigationPolicy(canary_weight=weight))
    ev = m.on_incident(inc("open", "leaf0->spine1|spine1->leaf2", None, ["spine1->leaf2", "leaf0->spine1"]))
    assert actions(ev) == [("canary", "leaf0->spine1")] and f"{weight:g} of its share" in ev[0]["reason"]
    assert fab.weights == {"leaf0->spine1": weight}


def test_a_canary_weight_of_one_leaves_the_suspect_alone_and_still_drains_the_named_link():
    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab, MitigationPolicy(canary_weight=1))
    lid = "leaf0->spine1|spine1->leaf2"
    assert m.on_incident(inc("open", lid, None, ["spine1->leaf2", "leaf0->spine1"])) == []
    assert fab.calls == []
    assert actions(m.on_incident(inc("localized", "spine1->leaf2", "spine1->leaf2", previous_id=lid))) == \
        [("drain", "spine1->leaf2")]
    assert fab.out == {"spine1->leaf2"} and fab.weights == {}


def test_a_specs_canary_weight_reaches_the_policy():
    from analysis.spec import from_dict

    spec = from_dict({"mitigation": {"canary_weight": "0.5", "max_per_switch": 1}})
    assert spec.mitigation == MitigationPolicy(max_per_switch=1, canary_weight=0.5)
    assert spec.to_dict()["mitigation"]["canary_weight"] == 0.5          # the run's spec.json keeps it
    assert from_dict({"mitigation": {}}).mitigation.canary_weight == CANARY_WEIGHT


def test_the_exported_series_follow_the_policys_weight_and_an_operators_restore():
    """flowpulse_link_canary_weight carries the weight the policy set (not the default), and
    flowpulse_link_drained ends with an operator's restore, before any further incident event (the
    drain alert built on it resolves then)."""
    from agent.incidents import IncidentTracker
    from agent.metrics import AgentCollector

    def series(m: Mitigator) -> dict[str, list[tuple[dict, float]]]:
        fams = AgentCollector([], IncidentTracker(FABRIC, None), m).collect()
        return {f.name: [(s.labels, s.value) for s in f.samples] for f in fams
                if f.name in ("flowpulse_link_drained", "flowpulse_link_canary_weight")}

    fab = FakeFabric(FABRIC)
    m = Mitigator(FABRIC, fab, MitigationPolicy(canary_weight=0.5))
    lid = "leaf0->spine1|spine1->leaf2"
    m.on_incident(inc("open", lid, None, ["spine1->leaf2", "leaf0->spine1"]))
    assert series(m)["flowpulse_link_canary_weight"] == [({"link": "leaf0->spine1", "incident": lid}, 0.5)]
    m.on_incident(inc("localized", "leaf0->spine1", "leaf0->spine1", previous_id=lid))
    got = series(m)
    assert got["flowpulse_link_drained"] == [({"link": "leaf0->spine1", "incident": "leaf0->spine1"}, 1)]
    assert got["flowpulse_link_canary_weight"] == []
    fab.out.clear()                                            # `flowpulse fabric restore leaf0->spine1`
    assert series(m)["flowpulse_link_drained"] == []
