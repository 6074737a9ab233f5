"""Offline replay: the agent's detector on recorded counters, with other parameters.

Works on an experiment's run directory (pulses/pulses-<switch>.jsonl, report.json)
and on recorded pulse traces (pulses.csv + meta.json). Same detector code as the
live agent: only the source of PulseCounts differs.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from agent.detector import DetectorConfig
from agent.feed import FeedHeader, Judge, feed_lines
from agent.incidents import summarize
from agent.pulse import PulseCounts
from analysis.rundir import load_report
from analysis.scoring import detection_summary
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec, SprayChange, SprayMode

log = logging.getLogger("flowpulse.replay")


REPLAYED = ("spec", "faults", "iterations")   # what a replay reads of a run's report


def run_detectors(fabric: Fabric, pulses: dict[str, list[PulseCounts]], cfg: DetectorConfig,
                  spray: SprayMode, weights: dict | None = None, oos_texts: list[str] | None = None,
                  degraded: list[str] | None = None,
                  changes: Sequence[SprayChange] = ()) -> tuple[list[dict], list[dict]]:
    """Each switch's detector over its own pulses, all switches' pulses in time order (as live), and
    the incident tracker over their alerts: (alert events, incident events). ``changes``: the run's
    spray changes (drains, weights), each pulse judged by the shares of its time."""
    judge = Judge(fabric, cfg, spray, fabric.parse_link_list(oos_texts), fabric.parse_link_list(degraded), weights,
                  changes=list(changes))
    events: list[dict] = []
    for pc in in_time_order(pulses):
        events += judge.observe(pc)[0]
    return events, judge.tracker.history


def judged_run(path: Path, cfg: DetectorConfig | None = None) -> tuple[Judge, dict]:
    """A run directory's pulses (``pulses/``) through a :class:`Judge` of its fabric, spray and links out
    of service, in time order: the judge as the run left it (its detectors, ledgers and tracker) and the
    run's report."""
    from analysis.rundir import load_pulses

    report, fabric, changes = load_run(Path(path))
    spec = report["spec"]
    judge = Judge(fabric, cfg or DetectorConfig(), SprayMode.parse(spec["spray"]),
                  fabric.parse_link_list(spec.get("out_of_service")), changes=changes)
    for pc in in_time_order(load_pulses(Path(path) / "pulses")):
        judge.observe(pc)
    return judge, report


def load_run(path: Path) -> tuple[dict, Fabric, list[SprayChange]]:
    """A run directory's report (checked), its fabric and its spray changes (checked), before any pulse
    is read: a malformed report stops a replay with one line and nothing judged."""
    report = load_report(path, REPLAYED)
    fabric = Fabric(FabricSpec.from_dict(report["spec"]["fabric"]))
    return report, fabric, spray_changes(path, report, fabric)


def spray_changes(path: Path, report: dict, fabric: Fabric) -> list[SprayChange]:
    """The spray changes a run recorded (``mitigation.spray_changes``: the mitigation's drains and canary
    weights, an operator's drains), checked against the report's schema: the agents judged each pulse by
    the shares of its time, and so does a replay. A run with a mitigation policy and no record of them
    (a report from before they were kept) is replayed with its first shares throughout, said once on
    stderr: the suspect uplink's canary share reads as a loss of three quarters of its traffic."""
    from analysis.rundir import REPORT_SCHEMA
    from netns_testbed import untrusted
    from netns_testbed.state import change_from_dict

    mit = report.get("mitigation")
    if mit is None:
        return []
    try:
        untrusted.check_parts(REPORT_SCHEMA, report, ("mitigation",))
    except untrusted.BadInput as e:
        raise SpecError(f"{Path(path) / 'report.json'}: {e}: run the experiment again") from None
    if "spray_changes" not in mit:
        if (report.get("spec") or {}).get("mitigation") and mit.get("actions"):
            log.warning("%s: the run's mitigation acted but its report keeps no spray changes (an older run): "
                        "replayed with its first shares throughout", path)
        return []
    if mit.get("spray_changes_lost"):
        log.warning("%s: the testbed kept the run's latest %d spray changes of %d: the pulses before them are "
                    "judged by the wrong shares", path, len(mit["spray_changes"]),
                    len(mit["spray_changes"]) + mit["spray_changes_lost"])
    return [change_from_dict(fabric, d) for d in mit["spray_changes"]]


def in_time_order(pulses: dict[str, list[PulseCounts]]) -> list[PulseCounts]:
    """Every switch's pulses in the order they ended (as a live agent of all switches sees them)."""
    order = sorted(((pc.end_time, i, sw, pc) for sw, seq in pulses.items() for i, pc in enumerate(seq)),
                   key=lambda x: (x[0], x[1]))
    return [pc for *_, pc in order]


def replay_dir(path: Path, cfg: DetectorConfig, degraded: list[str] | None = None) -> dict:
    path = Path(path)
    from analysis.traces import is_trace

    if is_trace(path):
        return _replay_trace(path, cfg, degraded)
    if not (path / "report.json").exists():
        raise SpecError(f"{path} holds neither a run (report.json) nor a recorded trace (pulses.csv[.gz])")
    from analysis.experiment import report_alerts
    from analysis.rundir import load_pulses

    report, fabric, changes = load_run(path)
    spec = report["spec"]
    pulses = load_pulses(path / "pulses")
    events, inc_events = run_detectors(fabric, pulses, cfg, SprayMode.parse(spec["spray"]), None,
                                       spec.get("out_of_service"), degraded, changes)
    alerts = report_alerts(events)
    applied = [f for f in report["faults"] if f.get("start")]
    incs = summarize(inc_events)
    return {"pulses": sum(len(v) for v in pulses.values()), "spray": spec["spray"], "events": events,
            "incidents": incs,
            "detection": detection_summary(applied, alerts, report["iterations"], incs)}


def run_as_feed(path: Path) -> Iterator[str]:
    """A recorded run (run directory) as feed lines: header, then every pulse in the order they ended."""
    from analysis.rundir import load_pulses

    path = Path(path)
    if not (path / "report.json").exists():
        raise SpecError(f"{path}: not a run directory (no report.json); --as-feed takes an experiment's run")
    report, fabric, changes = load_run(path)
    spec = report["spec"]
    oos = tuple(fabric.parse_link_list(spec.get("out_of_service")))
    header = FeedHeader(fabric, SprayMode.parse(spec["spray"]), oos, tuple(changes))
    return feed_lines(header, in_time_order(load_pulses(path / "pulses")))


def _replay_trace(path: Path, cfg: DetectorConfig, degraded: list[str] | None) -> dict:
    from analysis.traces import load_trace

    tr = load_trace(path)
    events, inc_events = run_detectors(tr.fabric, tr.pulses, cfg, SprayMode.parse(tr.spray), degraded=degraded)
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
    incs = summarize(inc_events)
    if tr.fault_link:
        named = [i["link"] for i in incs if i.get("link")]
        det.update({"localized": tr.fault_link in named,
                    "incidents_naming_healthy_links": sorted({l for l in named if l != tr.fault_link})})
    return {"pulses": sum(len(v) for v in tr.pulses.values()), "spray": tr.spray, "events": events,
            "incidents": incs, "detection": det}
