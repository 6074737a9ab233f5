"""What an open incident has cost so far, live, from what the agents see (for Prometheus).

An experiment's report has each fault's cost from the job's own iteration times (analysis/cost.py). A
real fabric's agent sees no job, but it sees the job's rhythm: a switch closes one pulse per collective
iteration, so the time from one pulse's start to the next is the iteration period as that switch sees it
(compute and idle included), and the owners' same-packet reference counts the TCP segments that came in
again (``SPAN_RESENT``: a retransmission, or a first transmission overtaken by more than one advance).
Per open incident, at the switch that first alerted on it:

* ``seconds``: from the incident's onset (its earliest alert's estimated onset, the detectors' CUSUM
  excursion start) to its first alert (``detect``), to the link named (``name``) and to the drain
  (``drain``, with the mitigation on);
* ``period``: the median seconds between pulse starts ``before`` the onset (the last BEFORE_S seconds),
  ``during`` the fault (from the onset to the drain, or to now), and ``after_drain`` (from the second
  pulse that starts after the drain on, as the report's cost counts from the second iteration: the
  first may still carry the fault's retransmissions);
* ``resent``: the median resent segments per pulse over the switch's ports in the same phases (where
  the switch keeps the reference).

:class:`PulseLog` keeps the last pulses' start times and resent counts per switch (SwitchAgent records
each pulse it reads); :func:`incident_costs` reads it with the tracker's and the mitigator's history.
"""
from __future__ import annotations

import statistics
from collections import deque

import numpy as np

from agent.pulse import SPAN_RESENT

BEFORE_S = 60.0        # the healthy rhythm: the pulses of the last minute before the onset
KEEP_PULSES = 4096     # pulses kept per switch (at 10 pulses a second, about 7 minutes)


class PulseLog:
    """The last KEEP_PULSES pulses of one switch: (start time, resent segments or None)."""

    def __init__(self) -> None:
        self.rows: deque[tuple[float, float | None]] = deque(maxlen=KEEP_PULSES)

    def add(self, start_time: float, span: np.ndarray | None) -> None:
        resent = float(span[..., SPAN_RESENT].sum()) if span is not None else None
        self.rows.append((float(start_time), resent))

    def phases(self, onset: float, drained: float | None, now: float) -> dict[str, dict[str, float | None]]:
        """Median period and resent segments per phase (None: too few pulses)."""
        rows = sorted(self.rows)
        # each pulse's period: to the next pulse's start (the last pulse has none yet)
        periods = [(t, rows[i + 1][0] - t, r) for i, (t, r) in enumerate(rows[:-1])]
        after_from = None
        if drained is not None:
            later = [t for t, _ in rows if t >= drained]
            after_from = later[1] if len(later) > 1 else None    # from the second pulse after the drain
        spans = {"before": (onset - BEFORE_S, onset), "during": (onset, drained if drained is not None else now),
                 "after_drain": (after_from, now) if after_from is not None else None}
        out: dict[str, dict[str, float | None]] = {}
        for phase, span in spans.items():
            sel = [(p, r) for t, p, r in periods if span is not None and span[0] <= t < span[1]]
            resent = [r for _, r in sel if r is not None]
            out[phase] = {"period_s": statistics.median(p for p, _ in sel) if sel else None,
                          "resent": statistics.median(resent) if resent else None}
        return out


def incident_costs(incidents: list, history: list[dict], actions: list[dict], logs: dict[str, PulseLog],
                   now: float) -> dict[str, dict]:
    """Per open incident (agent.incidents.Incident) its cost so far: ``seconds`` (detect, name, drain from
    the onset; None where it has not happened) and per phase its median period and resent segments at the
    switch that first alerted on it. ``history``: the tracker's incident events; ``actions``: the
    mitigator's (or [])."""
    out: dict[str, dict] = {}
    for inc in incidents:
        if not inc.alerts:
            continue
        # the alert that saw the fault first; an alert's entry is its latest event, so the incident's own
        # first time (when its first alert came) is the detection
        first = min(inc.alerts.values(), key=lambda a: a.onset_time or a.time)
        onset = first.onset_time or first.time
        # this incident's events only: an earlier incident on the same link had the same id
        mine = [ev for ev in history if ev.get("time", 0.0) >= inc.first_time]
        ids = {inc.incident_id}
        for ev in reversed(mine):          # and the ones it continues (a localizing incident that got its link)
            if ev.get("incident_id") in ids and ev.get("previous_id"):
                ids.add(ev["previous_id"])
        named = next((ev["time"] for ev in mine if ev.get("incident_id") in ids and ev.get("link")
                      and ev["event"] in ("open", "localized")), None)
        drained = next((act["time"] for act in actions if act.get("action") == "drain"
                        and act.get("incident_id") in ids and act["time"] >= inc.first_time), None)
        seconds = {"detect": inc.first_time - onset, "name": None if named is None else named - onset,
                   "drain": None if drained is None else drained - onset}
        log = logs.get(first.switch)
        out[inc.incident_id] = {"switch": first.switch, "onset": onset,
                                "seconds": {k: None if v is None else max(v, 0.0) for k, v in seconds.items()},
                                "phases": log.phases(onset, drained, now) if log is not None else {}}
    return out
