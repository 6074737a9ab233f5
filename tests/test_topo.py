"""The fabric model and the spec parsers: pure data, no root needed."""
from __future__ import annotations

import json

import pytest

from netns_testbed.errors import SpecError
from netns_testbed.datapath import smooth_wrr
from netns_testbed.faults import FaultKind, FaultSpec, parse_fault
from netns_testbed.topo import Fabric, FabricSpec, Link, check_prefix, parse_namespace


@pytest.fixture
def fab() -> Fabric:
    return Fabric(FabricSpec())


def test_default_names_and_ports(fab):
    assert fab.leaves == ["leaf0", "leaf1", "leaf2", "leaf3"]
    assert fab.spines == ["spine0", "spine1", "spine2", "spine3"]
    assert fab.hosts == [f"h{i}" for i in range(8)]
    # leaf ports: uplinks first (port k = spine k), then hosts
    assert [p.peer for p in fab.ports["leaf1"]] == ["spine0", "spine1", "spine2", "spine3", "h2", "h3"]
    assert [p.peer for p in fab.ports["spine2"]] == fab.leaves
    assert fab.host_leaf("h3") == "leaf1"
    assert fab.host_ip("h3") == "10.2.1.2"
    assert fab.source_leaf_of("10.2.1.2") == "leaf1"
    assert fab.source_leaf_of("10.101.2.1") is None
    assert len(fab.links()) == 2 * (16 + 8)
    assert len(fab.fabric_links()) == 32


def test_port_peers_are_symmetric(fab):
    for node, ports in fab.ports.items():
        for p in ports:
            back = fab.port(p.peer, p.peer_index)
            assert (back.peer, back.peer_index) == (node, p.index)
            assert p.address.network == back.address.network


def test_link_parsing(fab):
    assert fab.parse_link("leaf1->spine2") == Link("leaf1", "spine2")
    assert fab.parse_links("leaf1<->spine2") == [Link("leaf1", "spine2"), Link("spine2", "leaf1")]
    assert fab.parse_link("h3->leaf1").name == "h3->leaf1"
    for bad, word in [("leaf9->spine0", "unknown node"), ("leaf1-spine2", "bad link"), ("leaf0->leaf1", "no link"),
                      ("h3->leaf0", "no link"), ("", "bad link"), ("leaf01->spine1", "unknown node")]:
        with pytest.raises(SpecError, match=word):
            fab.parse_links(bad)


def test_fault_sites_are_between_counters(fab):
    s = fab.fault_site(Link("leaf1", "spine2"))
    assert (s.switch, s.port, s.hook) == ("leaf1", 2, "egress")
    s = fab.fault_site(Link("spine2", "leaf1"))
    assert (s.switch, s.port, s.hook) == ("spine2", 1, "egress")
    s = fab.fault_site(Link("leaf1", "h3"))
    assert (s.switch, s.port, s.hook) == ("leaf1", 5, "egress")
    s = fab.fault_site(Link("h3", "leaf1"))
    assert (s.switch, s.port, s.hook) == ("leaf1", 5, "ingress")


def test_spray_shares(fab):
    assert fab.spray_shares("leaf0", "leaf1") == {s: 0.25 for s in fab.spines}
    oos = fab.parse_links("leaf0<->spine1")
    assert set(fab.spray_shares("leaf0", "leaf1", out_of_service=oos)) == {"spine0", "spine2", "spine3"}
    # another leaf avoids spine1 only for traffic *to* leaf0
    assert "spine1" not in fab.spray_shares("leaf2", "leaf0", out_of_service=oos)
    assert "spine1" in fab.spray_shares("leaf2", "leaf3", out_of_service=oos)
    w = fab.spray_shares("leaf0", "leaf1", weights={"leaf0->spine0": 2})
    assert w["spine0"] == pytest.approx(0.4)


@pytest.mark.parametrize("kw", [dict(leaves=0), dict(spines=65), dict(hosts_per_leaf=-1), dict(mtu=100),
                                dict(leaves="4")])
def test_bad_spec(kw):
    with pytest.raises(SpecError):
        FabricSpec(**kw)


def test_spec_from_dict_rejects_unknown():
    with pytest.raises(SpecError, match="unknown fabric field"):
        FabricSpec.from_dict({"leaves": 2, "spine": 2})


def test_prefix_and_namespace_names():
    assert check_prefix("fp") == "fp"
    for bad in ("", "FP", "fp-1", "a" * 9, "1fp"):
        with pytest.raises(SpecError):
            check_prefix(bad)
    assert parse_namespace("fp-leaf2") == ("fp", "leaf2")
    assert parse_namespace("fp2-h10") == ("fp2", "h10")
    assert parse_namespace("fp-x-leaf2") is None
    assert parse_namespace("other") is None


def test_fault_parsing(fab):
    f = parse_fault(fab, "leaf1->spine2:drop=0.01")
    assert (f.link, f.kind, f.rate) == (Link("leaf1", "spine2"), FaultKind.DROP, 0.01)
    f = parse_fault(fab, "leaf1->spine2:drop=0.02,src=h1,dst=h6,flap=1/2")
    assert (f.src.text, f.dst.text, f.flap_on_s, f.flap_off_s) == ("h1", "h6", 1.0, 2.0)
    assert (str(f.src.network), str(f.dst.network)) == (f"{fab.host_ip('h1')}/32", f"{fab.host_ip('h6')}/32")
    assert str(parse_fault(fab, "leaf1->spine2:drop=0.1,src=leaf0,dst=10.3.0.0/16").src.network) == "10.1.0.0/16"
    assert FaultSpec.from_dict(json.loads(json.dumps(f.to_dict()))) == f   # the state file's round trip
    assert parse_fault(fab, "leaf0->spine1:partial=0.25").flows == 0.25
    assert parse_fault(fab, "h2->leaf1:blackhole").effective_rate == 1.0
    assert parse_fault(fab, f.describe()) == f
    for bad, word in [("leaf1->spine2:drop=1.5", r"\[0, 1\]"), ("leaf1->spine2:drop=-0.1", r"\[0, 1\]"),
                      ("leaf1->spine2:drop", "needs a rate"), ("leaf1->spine2:melt=0.1", "unknown fault kind"),
                      ("leaf7->spine2:drop=0.1", "unknown node"), ("leaf1->spine2", "bad fault"),
                      ("leaf1->spine2:drop=0.1,colour=red", "unknown fault modifier"),
                      ("leaf1->spine2:drop=0.1,src=spine1", "bad endpoint"),
                      ("leaf1->spine2:drop=abc", "must be a number"), ("leaf1->spine2:drop=nan", r"\[0, 1\]")]:
        with pytest.raises(SpecError, match=word):
            parse_fault(fab, bad)


def test_smooth_wrr_tables():
    assert smooth_wrr([(0, 1), (1, 1), (2, 1)]) == [0, 1, 2]
    t = smooth_wrr([(0, 2), (1, 1)])
    assert sorted(t) == [0, 0, 1] and t[0] == 0
    t = smooth_wrr([(0, 1), (1, 3)])
    assert t.count(1) == 3 * t.count(0)
    assert smooth_wrr([]) == []
    assert len(smooth_wrr([(i, 1 + i) for i in range(64)])) <= 256
