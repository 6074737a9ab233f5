"""Site files (no root): what the testbed exports loads back, and every bad file is one line naming it."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml

from agent.site import dump_site, load_site, schema, site_of_testbed
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec

REPO = Path(__file__).resolve().parent.parent
FABRIC = Fabric(FabricSpec(leaves=4, spines=4, hosts_per_leaf=2))


def fake_testbed(oos=(), weights=None):
    return SimpleNamespace(fabric=FABRIC, state=SimpleNamespace(gap_ms=50.0, spray="rrdst", weights=weights or {}),
                           out_of_service=FABRIC.parse_link_list(oos))


def write(tmp_path: Path, data: dict, name="site.yaml") -> Path:
    p = tmp_path / name
    p.write_text(dump_site(data) if "switch" in data else yaml.safe_dump(data))
    return p


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


@pytest.mark.parametrize("switch", ["leaf1", "spine2"])
def test_exported_site_loads_back(tmp_path, switch):
    tb = fake_testbed(oos=["leaf0<->spine3"], weights={"leaf1->spine0": 2.0})
    site = load_site(write(tmp_path, site_of_testbed(tb, switch)))
    assert site.switch == switch
    assert [p.ifname for p in site.fabric.ports[switch]] == list(site.ifnames)
    assert [p.peer for p in site.fabric.ports[switch]] == [p.peer for p in FABRIC.ports[switch]]
    assert {str(n): c for n, c in site.source_classes()} == {f"10.{i + 1}.0.0/16": i + 1 for i in range(4)}
    assert {l.name for l in site.out_of_service} == {"leaf0->spine3", "spine3->leaf0"}
    assert site.weights == {"leaf1->spine0": 2.0}
    assert site.verdicts == Path("/var/lib/flowpulse/verdicts")
    dep = site.deployment()
    assert dep.fabric.spray_shares("leaf1", "leaf2", dep.weights, dep.out_of_service) == \
        FABRIC.spray_shares("leaf1", "leaf2", tb.state.weights, tb.out_of_service)


def test_machine_interface_names_reach_the_alerts_model(tmp_path):
    data = site_of_testbed(fake_testbed(), "spine2")
    data["ports"] = {f"enp{i}s0": f"leaf{i}" for i in (3, 1, 0, 2)}   # any order, any names
    site = load_site(write(tmp_path, data))
    assert site.ifnames == ("enp0s0", "enp1s0", "enp2s0", "enp3s0")
    assert site.fabric.port_to("spine2", "leaf3").ifname == "enp3s0"
    assert site.fabric.port_to("leaf3", "spine2").ifname == "spine2"   # other switches keep the model's


def mutate(data: dict, path: str, value) -> dict:
    d = copy.deepcopy(data)
    *head, last = path.split(".")
    cur = d
    for k in head:
        cur = cur[k]
    if value is DELETE:
        del cur[last]
    else:
        cur[last] = value
    return d


DELETE = object()
BAD = [
    ("switch", "leaf9", "leaf9 is not in a fabric"),
    ("switch", "router1", "does not match"),
    ("fabric.leaves", 0, "fabric.leaves"),
    ("flowpulse_site", 2, "flowpulse_site"),
    ("spray", "ecmp", "spray"),
    ("pulse_gap_ms", -5, "pulse_gap_ms"),
    ("ports", {"leaf0": "leaf0", "leaf1": "leaf1", "leaf2": "leaf2"}, "no interface faces leaf3"),
    ("ports", {"a": "leaf0", "b": "leaf0", "c": "leaf2", "d": "leaf3"}, "leaf0 is faced by two interfaces"),
    ("ports", {"a": "leaf0", "b": "leaf1", "c": "leaf2", "d": "spine0"}, "spine0 is not a neighbour of spine2"),
    ("ports", {"a/b": "leaf0"}, "ports"),
    ("sources.leaf3", ["10.4.0.1/16"], "host bits set"),
    ("sources.leaf3", ["10.1.0.0/16"], "also given to leaf0"),
    ("sources.leaf3", DELETE, "no prefixes for leaf3"),
    ("sources.leaf7", ["10.8.0.0/16"], "no such leaf"),
    ("out_of_service", ["leaf0->spine9"], "out_of_service"),
    ("weights", {"leaf0->spine1": 0}, "weights.leaf0->spine1"),
    ("weights", {"spine1->leaf0": 1}, "does not match"),
    ("counters", "snmp", "counters"),
    ("colour", "blue", "colour"),
]


@pytest.mark.parametrize("path,value,word", BAD, ids=[b[0] + ":" + str(b[2])[:20] for b in BAD])
def test_bad_site_is_one_line_naming_it(tmp_path, path, value, word):
    good = site_of_testbed(fake_testbed(), "spine2")
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(mutate(good, path, value)))
    with pytest.raises(SpecError) as e:
        load_site(p)
    msg = str(e.value)
    assert word in msg and "\n" not in msg and str(p) in msg, msg


@pytest.mark.parametrize("text,word", [("switch: [unclosed\n", r"line \d: not valid YAML"), ("- a list\n", "expected a mapping"),
                                       ("ports: {1: leaf0}\n", "not a string")])
def test_unreadable_site_is_one_line(tmp_path, text, word):
    p = tmp_path / "site.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=word):
        load_site(p)
    with pytest.raises(SpecError, match="does not exist"):
        load_site(tmp_path / "missing.yaml")


def test_agent_with_a_bad_site_exits_2_and_builds_nothing(tmp_path):
    data = mutate(site_of_testbed(fake_testbed(), "spine2"), "switch", "leaf9")
    data["state_dir"] = str(tmp_path / "state")
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "flowpulse", "agent", "--site", str(p)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "leaf9" in r.stderr
    assert not (tmp_path / "state").exists()


def test_reload_takes_what_the_detector_uses_and_refuses_what_the_program_was_built_from(tmp_path):
    data = site_of_testbed(fake_testbed(), "leaf1")
    p = write(tmp_path, data)
    site = load_site(p)
    p.write_text(dump_site({**data, "out_of_service": ["leaf1<->spine0"]}))
    assert {l.name for l in site.reload().out_of_service} == {"leaf1->spine0", "spine0->leaf1"}
    p.write_text(dump_site({**data, "pulse_gap_ms": 80}))      # needs a new program: kept as it was
    assert site.reload().out_of_service == ()
    p.write_text("switch: [broken\n")                           # does not validate: kept as it was
    assert site.reload().fabric.spec == FABRIC.spec


def test_netlink_site_needs_every_leaf_to_spray_alike(tmp_path):
    data = {**site_of_testbed(fake_testbed(oos=["leaf0<->spine3"]), "leaf1"), "counters": "netlink"}
    with pytest.raises(SpecError, match="counters: netlink gives totals"):
        load_site(write(tmp_path, data))
    ok = load_site(write(tmp_path, {**site_of_testbed(fake_testbed(), "leaf1"), "counters": "netlink"}))
    assert not ok.deployment().per_source


def test_agent_names_an_interface_this_machine_lacks_and_builds_nothing(tmp_path):
    data = site_of_testbed(fake_testbed(), "spine2")
    data["ports"] = {f"fpnosuch{i}": f"leaf{i}" for i in range(4)}
    data["state_dir"] = str(tmp_path / "state")
    p = write(tmp_path, data)
    r = subprocess.run([sys.executable, "-m", "flowpulse", "agent", "--site", str(p), "--alerts",
                        str(tmp_path / "alerts.jsonl")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "no interface 'fpnosuch0'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "state").exists() and not (tmp_path / "alerts.jsonl").exists()
