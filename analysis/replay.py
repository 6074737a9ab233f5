"""Offline replay: the agent's detector on recorded counters, with other parameters.

Works on an experiment's run directory (pulses/pulses-<switch>.jsonl, report.json)
and on recorded pulse traces (pulses.csv + meta.json). Same detector code as the
live agent: only the source of PulseCounts differs.
"""
from __future__ import annotations

import json
from pathlib import Path

from agent.detector import DetectorConfig, SwitchDetector
from agent.pulse import PulseCounts
from analysis.localize import incidents as make_incidents
from analysis.scoring import detection_summary
from flowpulse.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec, SprayMode


def run_detectors(fabric: Fabric, pulses: dict[str, list[PulseCounts]], cfg: DetectorConfig,
                  spray: SprayMode, weights: dict | None = None, oos_texts: list[str] | None = None,
                  degraded: list[str] | None = None) -> list[dict]:
    """Each switch's detector over its own pulses; events in time order."""
    oos = [l for t in oos_texts or [] for l in fabric.parse_links(t)]
    deg = [l for t in degraded or [] for l in fabric.parse_links(t)]
    events = []
    for sw, seq in pulses.items():
        det = SwitchDetector(fabric, sw, cfg, spray, weights, oos, deg)
        for pc in seq:
            for a in det.observe(pc):
                d = a.to_dict()
                if "iter" in pc.meta:
                    d["iteration"] = pc.meta["iter"]
                events.append(d)
    return sorted(events, key=lambda e: (e["time"], e.get("iteration") or 0))


def replay_dir(path: Path, cfg: DetectorConfig, degraded: list[str] | None = None) -> dict:
    path = Path(path)
    from analysis.traces import is_trace

    if is_trace(path):
        return _replay_trace(path, cfg, degraded)
    if not (path / "report.json").exists():
        raise SpecError(f"{path} holds neither a run (report.json) nor a recorded trace (pulses.csv[.gz])")
    from analysis.experiment import load_pulses, report_alerts

    report = json.loads((path / "report.json").read_text())
    spec = report["spec"]
    fabric = Fabric(FabricSpec.from_dict(spec["fabric"]))
    pulses = load_pulses(path / "pulses")
    events = run_detectors(fabric, pulses, cfg, SprayMode.parse(spec["spray"]), None, spec.get("out_of_service"),
                           degraded)
    alerts = report_alerts(events)
    applied = [f for f in report["faults"] if f.get("start")]
    incs = make_incidents(fabric, events, pulses)
    return {"pulses": sum(len(v) for v in pulses.values()), "spray": spec["spray"], "events": events,
            "incidents": [i.to_dict() for i in incs],
            "detection": detection_summary(applied, alerts, report["iterations"], incs)}


def _replay_trace(path: Path, cfg: DetectorConfig, degraded: list[str] | None) -> dict:
    from analysis.traces import load_trace

    tr = load_trace(path)
    events = run_detectors(tr.fabric, tr.pulses, cfg, SprayMode.parse(tr.spray), degraded=degraded)
    det = None
    if tr.fault_link:
        rel = [e for e in events if e["event"] == "alert" and (e.get("iteration") or 0) >= tr.fault_iter
               and (tr.fault_link == e["link"] or tr.fault_link in e["candidates"])]
        false = [e for e in events if e["event"] == "alert" and e not in rel]
        det = {"fault": tr.fault_link, "rate": tr.fault_p, "detected": bool(rel),
               "iterations_to_detect": rel[0]["iteration"] - tr.fault_iter + 1 if rel else None,
               "false_alerts": len(false)}
    else:
        det = {"fault": None, "false_alerts": sum(1 for e in events if e["event"] == "alert")}
    return {"pulses": sum(len(v) for v in tr.pulses.values()), "spray": tr.spray, "events": events, "detection": det}
