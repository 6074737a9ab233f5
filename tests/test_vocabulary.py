"""One vocabulary from the command line to the kernel: each spray mode, fault kind, hook, backend and
workload is an enum parsed once where it comes in, and the C side's constants match the Python side's
members one for one (the contract's static asserts check the values of the constants Python names;
this checks that neither side has one the other lacks, and that every place a new member needs is
filled)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from netns_testbed import datapath as dp
from netns_testbed.faults import INJECTOR_ACTION, Backend, FaultKind
from netns_testbed.topo import Hook, SprayMode

ROOT = Path(__file__).resolve().parent.parent
SWITCH_H = ROOT / "netns_testbed" / "bpf" / "switch.h"


def defines(header: str, prefix: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2), 0)
            for m in re.finditer(rf"^#define ({prefix}\w+)\s+(\d+|0x[0-9a-fA-F]+)\b", header, re.M)}


def spray_drift(header: str) -> list[str]:
    """What differs between bpf/switch.h's FP_SPRAY_* modes and SprayMode with its codes."""
    c = {k: v for k, v in defines(header, "FP_SPRAY_").items() if k not in ("FP_SPRAY_OFF", "FP_SPRAY_SLOTS")}
    py = {f"FP_SPRAY_{m.name}": dp.SPRAY_CODES.get(m) for m in SprayMode}
    out = [f"{k} in switch.h, no SprayMode member" for k in sorted(set(c) - set(py))]
    out += [f"SprayMode.{k[9:]} has no {k} in switch.h" for k in sorted(set(py) - set(c))]
    out += [f"{k}: {c[k]} in switch.h, {py[k]} in datapath.SPRAY_CODES" for k in sorted(set(c) & set(py))
            if c[k] != py[k]]
    return out


def fault_drift(header: str) -> list[str]:
    """What differs between switch.h's FP_FAULT_* actions and the kinds the injector maps onto them."""
    c = {v for k, v in defines(header, "FP_FAULT_").items() if k != "FP_FAULT_NONE"}
    used = set(INJECTOR_ACTION.values())
    out = [f"FP_FAULT_ value {v} is no FaultKind's action" for v in sorted(c - used)]
    out += [f"action {v} is not in switch.h" for v in sorted(used - c)]
    return out


def test_the_c_and_python_vocabularies_agree():
    header = SWITCH_H.read_text()
    assert spray_drift(header) == []
    assert fault_drift(header) == []


def test_a_spray_mode_on_one_side_only_is_found():
    header = SWITCH_H.read_text()
    assert spray_drift(header + "\n#define FP_SPRAY_ZIGZAG 4\n") == ["FP_SPRAY_ZIGZAG in switch.h, no SprayMode member"]
    without = re.sub(r"^#define FP_SPRAY_RR \d+.*$", "", header, flags=re.M)
    assert spray_drift(without) == ["SprayMode.RR has no FP_SPRAY_RR in switch.h"]
    renumbered = re.sub(r"^#define FP_SPRAY_RRDST \d+", "#define FP_SPRAY_RRDST 7", header, flags=re.M)
    assert spray_drift(renumbered) == ["FP_SPRAY_RRDST: 7 in switch.h, 3 in datapath.SPRAY_CODES"]
    assert fault_drift(header + "\n#define FP_FAULT_DELAY 3\n") == ["FP_FAULT_ value 3 is no FaultKind's action"]


def test_every_spray_mode_has_each_thing_a_mode_needs():
    from agent.detector.checks import SPRAY_NOISE
    from analysis.model import SPLITS

    for mode in SprayMode:
        assert mode in dp.SPRAY_CODES, f"datapath.SPRAY_CODES has no code for {mode}"
        assert mode.help, f"{mode} has no help"
        assert mode in SPRAY_NOISE, f"agent.detector.checks.SPRAY_NOISE has no noise model for {mode}"
        assert mode in SPLITS, f"analysis.model.SPLITS has no split for {mode}"
    assert f"FP_SPRAY_{SprayMode.RRDST.name}" in dp.C_CONSTANTS     # the contract asserts their values


def test_every_fault_kind_has_an_injector_action_or_is_refused_by_it():
    from netns_testbed.faults import check_backend, parse_fault
    from netns_testbed.topo import Fabric, FabricSpec
    from netns_testbed.errors import SpecError

    fab = Fabric(FabricSpec())
    for kind in FaultKind:
        if kind in INJECTOR_ACTION:
            continue
        text = {"delay": "leaf0->spine1:delay=5ms"}[kind.value]
        with pytest.raises(SpecError):
            check_backend(parse_fault(fab, text), Backend.BPF)


def test_the_fault_record_is_built_from_the_kind_not_from_a_string():
    from netns_testbed.faults import kernel_record, parse_fault
    from netns_testbed.topo import Fabric, FabricSpec

    fab = Fabric(FabricSpec())
    rows = {"leaf0->spine1:drop=0.25": (dp.FAULT_DROP, dp.PROB_ONE // 4), "leaf0->spine1:blackhole": (dp.FAULT_DROP, dp.PROB_ONE),
            "leaf0->spine1:partial=0.5": (dp.FAULT_DROP, dp.PROB_ONE), "leaf0->spine1:corrupt=0.5": (dp.FAULT_CORRUPT, dp.PROB_ONE // 2)}
    for text, (action, prob) in rows.items():
        rec = kernel_record(parse_fault(fab, text))
        assert (rec.kind, rec.prob) == (action, prob), text
    assert kernel_record(parse_fault(fab, "leaf0->spine1:partial=0.5")).flow_frac == dp.FLOW_ALL // 2


def literal_choices() -> list[str]:
    """add_argument(..., choices=<a literal tuple or list>) anywhere in the CLI."""
    out = []
    for f in sorted((ROOT / "flowpulse").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for kw in node.keywords:
                    if kw.arg == "choices" and isinstance(kw.value, (ast.Tuple, ast.List)) \
                            and all(isinstance(e, ast.Constant) for e in kw.value.elts):
                        out.append(f"{f.name}:{node.lineno}")
    return out


def test_no_literal_choices_in_the_cli():
    assert literal_choices() == []


@pytest.mark.parametrize("argv,attr,want", [
    (["fabric", "up", "--spray", "rr"], "spray", SprayMode.RR),
    (["fabric", "up", "--hook", "clsact"], "hook", Hook.CLSACT),
    (["fault", "add", "--backend", "netem", "leaf0->spine1:drop=0.01"], "backend", Backend.NETEM),
    (["experiment", "--out", "x", "--spray", "random"], "spray", SprayMode.RANDOM),
])
def test_flags_arrive_as_members(argv, attr, want):
    from flowpulse.cli import build_parser

    got = getattr(build_parser().parse_args(argv), attr)
    assert got is want


def test_a_bad_choice_is_one_line_naming_the_choices(capsys):
    from flowpulse.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["fabric", "up", "--spray", "zigzag"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "invalid choice 'zigzag': choose one of random, rr, rrdst" in err


def test_state_and_specs_carry_the_members():
    from analysis.model import ModelSpec
    from analysis.spec import from_dict
    from netns_testbed.state import TestbedState

    st = TestbedState(prefix="fp", fabric={}, spray="rr", hook="tcx")
    assert st.spray is SprayMode.RR and st.hook is Hook.TCX
    assert '"spray": "rr"' in st.to_json() and '"hook": "tcx"' in st.to_json()
    assert ModelSpec(spray="random").spray is SprayMode.RANDOM
    assert from_dict({"spray": "rr"}).spray is SprayMode.RR


def test_every_check_implements_the_check_protocol():
    from agent.detector import DetectorConfig, SwitchDetector
    from agent.detector.checks import Check
    from netns_testbed.topo import Fabric, FabricSpec

    fab = Fabric(FabricSpec())
    checks = [c for sw in ("leaf0", "spine0") for c in SwitchDetector(fab, sw, DetectorConfig()).checks]
    checks += SwitchDetector(fab, "leaf0", DetectorConfig(), per_source=False).checks
    assert {type(c).__name__ for c in checks} == {"PeerCheck", "HostCheck", "SpineCheck", "TotalsPeerCheck"}
    for c in checks:
        assert isinstance(c, Check), type(c).__name__
        assert c.take_findings() == []


def test_alerts_are_typed_also_when_read_back():
    from agent.detector.alerts import Alert, AlertEvent, AlertKind, CheckKind

    a = Alert.from_dict({"event": "update", "alert_id": "leaf0/1/in/loss", "time": 1.0, "switch": "leaf0", "port": 1,
                         "kind": "loss", "evidence": {"test": "peer"}, "iteration": 3})
    assert a.event is AlertEvent.UPDATE and a.kind is AlertKind.LOSS and a.test is CheckKind.PEER
    assert a.to_dict()["kind"] == "loss" and '"kind": "loss"' in __import__("json").dumps(a.to_dict())
    with pytest.raises(ValueError):
        Alert.from_dict({"event": "alert", "alert_id": "x", "time": 1.0, "switch": "leaf0", "port": 1, "kind": "lost"})
