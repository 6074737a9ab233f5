"""The agents' whole pipeline on model-generated counters: detectors per switch, the live incident tracker.

One call runs a :class:`analysis.model.FabricModel` for some pulses with faults
switched on and off at given pulses, feeds every switch's counts to its own
:class:`SwitchDetector` (as the agents do), and every alert event to an
:class:`IncidentTracker` that asks the owners for verdicts in process (as
``agent --all`` does). Pulse ``i`` is stamped ``[i, i + 0.5]`` seconds.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.detector import DetectorConfig, SwitchDetector
from agent.incidents import EvidenceSource, IncidentTracker, LocalEvidence
from analysis.model import FabricModel, ModelSpec


@dataclass
class ModelRun:
    alerts: list[dict] = field(default_factory=list)       # alert events, with "iteration"
    incidents: list[dict] = field(default_factory=list)    # incident events, with "iteration"
    detectors: dict = field(default_factory=dict)          # switch -> its SwitchDetector, as the run left it


def run_model(spec: ModelSpec, pulses: int, schedule: dict[int, dict[str, dict[str, float]]],
              cfg: DetectorConfig | None = None, out_of_service: list | None = None,
              evidence: Callable[[dict], EvidenceSource] | None = None,
              on_pulse: Callable[[int, dict], None] | None = None, fed: set[str] | None = None) -> ModelRun:
    """``schedule``: pulse -> {"drop": {link: rate}, "corrupt": {link: rate}} in force from that pulse.
    ``evidence(detectors)``: where the tracker gets the owners' verdicts (default: the detectors, in
    process); ``on_pulse(i, detectors)`` runs after each pulse is judged (verdict files written, and so
    on); ``fed``: only these switches' alerts reach the tracker (as a tracker in one switch's agent)."""
    model = FabricModel(spec)
    fab = model.fabric
    cfg = cfg or DetectorConfig(rotations=spec.ncpu * fab.spec.hosts_per_leaf)
    dets = {sw: SwitchDetector(fab, sw, cfg, spec.spray, spec.weights, out_of_service or model.oos)
            for sw in fab.switches}
    tracker = IncidentTracker(fab, evidence(dets) if evidence else LocalEvidence(lambda: dets))
    run = ModelRun(detectors=dets)
    model.set_faults({}, {})
    for i in range(pulses):
        if i in schedule:
            model.set_faults(schedule[i].get("drop", {}), schedule[i].get("corrupt", {}))
        for sw, pc in model.step().items():
            pc.start_time, pc.end_time = float(i), i + 0.5
            for a in dets[sw].observe(pc):
                d = a.to_dict()
                d["iteration"] = i
                run.alerts.append(d)
                if fed is not None and sw not in fed:
                    continue
                for ev in tracker.feed(a, now=i + 0.5):
                    ev["iteration"] = i
                    run.incidents.append(ev)
        if on_pulse is not None:
            on_pulse(i, dets)
        for ev in tracker.tick(i + 0.5):
            ev["iteration"] = i
            run.incidents.append(ev)
    return run
