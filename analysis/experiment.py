"""Run one experiment end to end and write its run directory.

fabric up -> agents on every switch -> workload -> faults on schedule ->
counters, alerts, workload summary recorded -> fabric down (always, also on
failure or Ctrl-C) -> report.json (+ plots by analysis/report.py).

Run directory::

    report.json          the contract (faults, alerts, iterations, detection)
    alerts.jsonl         every alert event of every switch's agent
    incidents.jsonl      every live incident event (one incident per fault, naming the link), and
                         the mitigation's actions (``"event": "mitigation"``) when the spec asks for it
    pulses/pulses-<switch>.jsonl   per-switch per-port pulse counters (+ scores)
    workload/            rank logs, per-rank results, workload.json
    baselines.json       what interface-counter and host-retransmission monitors saw
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from agent.daemon import AgentOptions, JsonLinesSink, SwitchAgent, make_tracker, run_agents
from agent.incidents import summarize
from agent.mitigation import Mitigator, TestbedActuator
from analysis import baselines
from analysis.cost import fault_cost
from analysis.scoring import detection_summary
from analysis.spec import ExperimentSpec, ScheduledFault
from netns_testbed import builder, faults as fault_ops
from netns_testbed.faults import Backend
from netns_testbed.safefiles import secure_dir
from netns_testbed.state import Testbed, change_to_dict
from workload.launcher import run_job

log = logging.getLogger("flowpulse.experiment")
REPORT_VERSION = 1


class FaultScheduler(threading.Thread):
    """Switches faults on when their start comes: in the idle gap before iteration K
    (rank 0 reports each iteration's end) or at t seconds after the job started."""

    def __init__(self, tb: Testbed, scheduled: list[ScheduledFault], progress: Path, say: Callable[[str], None],
                 backend: Backend = Backend.BPF):
        super().__init__(daemon=True)
        self.tb, self.scheduled, self.progress, self.say, self.backend = tb, scheduled, progress, say, backend
        self.stop = threading.Event()
        self.started_at: float | None = None
        self.applied: dict[str, float] = {}
        self.errors: list[str] = []

    def apply(self, sf: ScheduledFault) -> None:
        fault_ops.apply(self.tb, sf.fault, backend=self.backend)
        self.applied[sf.fault.link.name] = time.time()
        self.say(f"fault on: {sf.fault.describe()}")

    def run(self) -> None:
        pending = list(self.scheduled)
        for sf in [s for s in pending if s.at_iter == 0]:
            self.apply(sf)
            pending.remove(sf)
        ended: set[int] = set()
        offset, partial = 0, ""
        while pending and not self.stop.is_set():
            if self.progress.exists():
                with open(self.progress) as f:  # read only what rank 0 appended since last time
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                lines = (partial + chunk).split("\n")
                partial = lines.pop()  # an incomplete last line waits for its end
                for line in lines:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if rec["phase"] == "start" and self.started_at is None:
                        self.started_at = rec["t"]
                    if rec["phase"] == "end":
                        ended.add(rec["i"])
            for sf in list(pending):
                due = (sf.at_iter is not None and sf.at_iter - 1 in ended) or \
                      (sf.at_t is not None and self.started_at is not None and time.time() >= self.started_at + sf.at_t)
                if due:
                    try:
                        self.apply(sf)
                    except Exception as e:  # report, keep the run going
                        self.errors.append(f"{sf.text}: {e}")
                    pending.remove(sf)
            self.stop.wait(0.01)


def injector_counts(tb) -> dict[str, dict]:
    """Per fault still on, what its injector selected and hit (the BPF injector's packets selected and
    dropped or damaged; netem's packets through it and dropped, None where it counts none). A fault that
    hit nothing (a partial blackhole whose flow share no flow hashed into) could not be caught."""
    try:
        return {r["link"]: {"matched": r["matched"], "hit": r["hit"]} for r in fault_ops.listing(tb)}
    except Exception as e:   # a count that cannot be read costs the report a figure, not the run
        log.warning("the injectors' counts could not be read (%s): the report leaves them out", e)
        return {}


def run_experiment(spec: ExperimentSpec, out: Path, progress: Callable[[str], None] | None = None) -> dict:
    """Run it; returns report.json's content. The testbed is always removed."""
    spec.validate()
    if spec.fault_backend is Backend.NETEM:
        fault_ops.require_netem()
    say = progress or log.info
    secure_dir(out)
    sink = JsonLinesSink(out / "alerts.jsonl")          # before anything is built: a refused file builds nothing
    inc_sink = JsonLinesSink(out / "incidents.jsonl")
    (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
    tb = builder.up(spec.prefix, spec.fabric, spec.up_options(), progress=say)
    stop = threading.Event()
    agents: list[SwitchAgent] = []
    failed: list[BaseException] = []
    sched = None
    t_start = time.time()
    try:
        aopts = AgentOptions(cfg=spec.detector, record=out / "pulses")
        agents = [SwitchAgent.on_testbed(tb, sw, aopts, sinks=[sink]) for sw in tb.fabric.switches]
        tracker = make_tracker(agents)
        mitigator = Mitigator(tb.fabric, TestbedActuator(tb.prefix), spec.mitigation) if spec.mitigation else None
        def watch() -> None:
            try:
                run_agents(agents, stop, 0.01, tracker=tracker, incident_sinks=[inc_sink], mitigator=mitigator)
            except BaseException as e:         # told at the end of the run, in the report and the log
                log.exception("the agents' poll loop stopped")
                failed.append(e)

        th = threading.Thread(target=watch, daemon=True, name="flowpulse-agents")
        th.start()
        say(f"agents watching {len(agents)} switches")
        base_before = baselines.snapshot(tb)
        job_dir = out / "workload"
        job_dir.mkdir(exist_ok=True)
        (job_dir / "progress.jsonl").unlink(missing_ok=True)
        sched = FaultScheduler(tb, spec.faults, job_dir / "progress.jsonl", say, spec.fault_backend)
        sched.start()
        job = run_job(tb, spec.job, job_dir, progress=say)
        sched.stop.set()
        time.sleep(spec.gap_ms / 1000 * 2 + 0.3)  # let the last pulse close and be judged
        stop.set()
        th.join(timeout=5)
        fault_end = time.time()
        base_after = baselines.snapshot(tb)
        injected = injector_counts(tb)
        fault_ops.clear(tb)
        end_state = Testbed.load(tb.prefix)
        drained_at_end = sorted(end_state.state.drained)
        # what the leaves sprayed over, and when each change switched (a replay judges each pulse by the
        # shares of its time, as the agents did); the state keeps the latest MAX_CHANGES
        spray_changes = [change_to_dict(c) for c in end_state.spray_changes]
        changes_lost = end_state.state.epoch - len(spray_changes)
        agent_cpu = {a.switch: a.busy_s for a in agents}
        agent_errors = {a.switch: a.errors for a in agents if a.errors}
    finally:
        stop.set()
        if sched:
            sched.stop.set()
        for a in agents:
            a.close()
        sink.close()
        inc_sink.close()
        builder.down(spec.prefix)
    events = [json.loads(l) for l in (out / "alerts.jsonl").read_text().splitlines() if l.strip()]
    fault_rows = [{"link": sf.fault.link.name, "kind": sf.fault.kind.value, "rate": sf.fault.effective_rate,
                   "spec": sf.fault.describe(), "start": sched.applied.get(sf.fault.link.name) if sched else None,
                   "end": fault_end if sched and sf.fault.link.name in sched.applied else None,
                   **injected.get(sf.fault.link.name, {"matched": None, "hit": None})}
                  for sf in spec.faults]
    applied = [f for f in fault_rows if f["start"] is not None]
    iterations = [{"index": it["index"], "start": it["start"], "end": it["end"], "duration_s": it["duration_s"],
                   "retrans_segs": sum(it.get("retrans_segs", [])), "tx_bytes": sum(it["tx_bytes"])}
                  for it in job.iterations]
    stream = [json.loads(l) for l in (out / "incidents.jsonl").read_text().splitlines() if l.strip()]
    actions = [e for e in stream if e.get("event") == "mitigation"]
    inc_events = [e for e in stream if e.get("event") != "mitigation"]
    incs = summarize(inc_events)
    alerts = report_alerts(events)
    base = baselines.evaluate(tb.fabric, base_before, base_after, job, applied)
    (out / "baselines.json").write_text(json.dumps(base, indent=2))
    report = {
        "version": REPORT_VERSION,
        "spec": spec.to_dict(),
        "started": t_start,
        "finished": time.time(),
        "fabric": {"leaves": tb.fabric.leaves, "spines": tb.fabric.spines, "hosts": tb.fabric.hosts,
                   "links": [l.name for l in tb.fabric.links()]},
        "faults": fault_rows,
        "alerts": alerts,
        "incidents": incs,
        "iterations": iterations,
        "workload": {"ok": job.ok, "failure": job.failure, "failed_rank": job.failed_rank, **job.summary},
        "detection": detection_summary(applied, alerts, iterations, incs),
        "baselines": base,
        "mitigation": {"policy": spec.to_dict()["mitigation"], "actions": actions, "drained_at_end": drained_at_end,
                       "spray_changes": spray_changes, "spray_changes_lost": changes_lost},
        "cost": [fault_cost(f, iterations, alerts, inc_events, actions) for f in applied],
        "agent_busy_s": agent_cpu,
        "agent_errors": agent_errors,               # polls that raised, per switch (logged with their traceback)
        "agents_failed": repr(failed[0]) if failed else None,   # the poll loop stopped before the run's end
        "scheduler_errors": sched.errors if sched else [],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    return report


def report_alerts(events: list[dict]) -> list[dict]:
    """One entry per alert (its first event), with the link its later updates settled on."""
    latest = {ev["alert_id"]: ev for ev in events if ev["event"] != "resolved"}
    out = []
    for ev in events:
        if ev["event"] != "alert":
            continue
        last = latest.get(ev["alert_id"], ev)
        out.append({"time": ev["time"], "switch": ev["switch"], "port": ev["port"], "ifname": ev["ifname"],
                    "link": last.get("link"), "first_link": ev.get("link"), "candidates": ev["candidates"],
                    "kind": ev["kind"], "estimated_rate": last["estimated_rate"], "score": ev["score"],
                    "pulse": ev["pulse"], "pulse_start": ev["pulse_start"], "alert_id": ev["alert_id"],
                    "window": ev["window"], "evidence": ev["evidence"]})
    return out

