"""Interface-statistics counts (no split by source leaf) on counter-model streams with known truth:
what the leaves' totals test catches, that it names the spine's links, and where it must refuse."""
from __future__ import annotations

import numpy as np
import pytest

from agent.detector import DetectorConfig, SwitchDetector
from agent.pulse import PulseCounts
from analysis.model import FabricModel, ModelSpec
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec


def totals(pc: PulseCounts) -> PulseCounts:
    """What interface statistics give: every packet of a port and direction in one class."""
    ip = np.zeros_like(pc.ip)
    ip[:, :, 0] = pc.ip.sum(axis=2)
    return PulseCounts(pc.switch, pc.pulse, ip, pc.bad, start_time=pc.start_time, end_time=pc.end_time)


def run(faults: dict, pulses: int, onset: int, seed: int):
    spec = ModelSpec(spray="rrdst", seed=seed, faults=faults)
    model = FabricModel(spec)
    dets = {sw: SwitchDetector(model.fabric, sw, DetectorConfig(), "rrdst", per_source=False)
            for sw in model.fabric.switches}
    model.set_faults({}, {})
    events = []
    for i in range(pulses):
        if i == onset:
            model.set_faults(spec.faults, spec.corrupt)
        for sw, pc in model.step().items():
            events += [(i, a) for a in dets[sw].observe(totals(pc)) if a.event == "alert"]
    return events, dets


def test_silent_on_300_healthy_pulses_and_spines_judge_only_damaged_frames():
    events, dets = run({}, 300, 0, seed=11)
    assert events == []
    assert dets["spine0"].checks == [] and dets["spine0"].owner.ledger is None
    # leaves judge their uplinks' totals; not their host links (no D-SACKs: tests/test_host_dsack.py)
    assert [c.kind for c in dets["leaf0"].checks] == ["peer"]


@pytest.mark.parametrize("link,rate", [("spine1->leaf2", 0.005), ("leaf0->spine1", 0.01)])
def test_a_loss_into_a_spine_or_out_of_it_is_caught_and_names_the_spines_links(link, rate):
    events, _ = run({link: rate}, 12, 4, seed=3)
    assert events and events[0][0] <= 5, events[:2]
    for _, a in events:
        assert link in a.candidates and a.link is None, a
        spine = link.split("->")[1] if link.startswith("leaf") else link.split("->")[0]
        assert all(spine in c for c in a.candidates), a.candidates


def test_refuses_what_totals_cannot_judge():
    fab = Fabric(FabricSpec())
    with pytest.raises(SpecError, match="spray over its uplinks alike"):
        SwitchDetector(fab, "leaf1", DetectorConfig(), "rrdst", out_of_service=fab.parse_links("leaf0<->spine2"),
                       per_source=False)
    with pytest.raises(SpecError, match="spray over its uplinks alike"):
        SwitchDetector(fab, "leaf1", DetectorConfig(), "rrdst", weights={"leaf2->spine0": 2.0}, per_source=False)
