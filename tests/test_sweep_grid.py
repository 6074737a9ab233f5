"""The sweep's grid (no root): every kind it accepts becomes the fault it names, on the links it draws."""
from __future__ import annotations

import pytest

from analysis.spec import ExperimentSpec
from analysis.sweep import SWEEP_KINDS, SweepSpec
from netns_testbed.faults import FaultKind
from netns_testbed.topo import Fabric, FabricSpec

BASE = ExperimentSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2))


@pytest.mark.parametrize("kind", SWEEP_KINDS)
def test_each_kind_becomes_its_fault_on_distinct_drawn_links(kind):
    sw = SweepSpec(base=BASE, kinds=[kind], rates=[0.005, 0.25], links=3, seeds=[0, 1], fault_at=12).validate()
    fabric = Fabric(BASE.fabric)
    pts = sw.points()
    assert len(pts) == 2 * 2 * 3
    for k, rate, link, seed in pts:
        f = sw.fault(fabric, k, rate, link)
        assert f.fault.kind is kind and f.fault.link.name == link and f.at_iter == 12
        if kind is FaultKind.PARTIAL:      # a share of the flows, every packet of theirs
            assert f.fault.flows == rate and f.fault.rate == 1.0
        else:
            assert f.fault.rate == rate
    for rate in (0.005, 0.25):
        for seed in (0, 1):
            links = [p[2] for p in pts if p[1] == rate and p[3] == seed]
            assert len(set(links)) == 3


def test_the_grid_is_the_same_from_one_run_to_the_next():
    sw = SweepSpec(base=BASE, kinds=list(SWEEP_KINDS), rates=[0.01], links=2)
    assert sw.points() == SweepSpec(base=BASE, kinds=list(SWEEP_KINDS), rates=[0.01], links=2).points()
