"""What a fault cost the job, and what draining it gave back (report.json's ``cost``).

Per applied fault, from the job's iterations (rank 0's times), the alerts, the incident events and the
mitigation events of the run:

* ``before_ms``: median iteration time of the iterations that ended before the fault went on (the
  first iteration, which sets up the connections, left out);
* ``during_ms``: median of the iterations that started after the fault went on and ended before the
  drain (all of them after the fault when nothing was drained);
* ``after_drain_ms``: median from the second iteration that started after the drain on (the first
  one may hold packets sent before it), None without a drain;
* ``retrans_*``: TCP segments the ranks retransmitted per iteration in the same windows (median);
* ``to_detect_s``, ``to_name_s``, ``to_drain_s``: seconds from the fault's start to the first alert
  that blames its link (named or among the candidates), to the incident event naming it, to its drain.
"""
from __future__ import annotations

import statistics


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def fault_cost(fault: dict, iterations: list[dict], alerts: list[dict], incidents: list[dict],
               actions: list[dict]) -> dict:
    link, t0 = fault["link"], fault["start"]
    detect = min((a["time"] for a in alerts if a["time"] >= t0 and (a.get("link") == link or link in
                                                                       (a.get("candidates") or []))), default=None)
    named = min((e["time"] for e in incidents if e.get("link") == link and e["time"] >= t0), default=None)
    drained = min((e["time"] for e in actions if e["action"] == "drain" and e["link"] == link and e["time"] >= t0),
                  default=None)
    its = sorted(iterations, key=lambda it: it["index"])
    before = [it for it in its[1:] if it["end"] < t0]
    during = [it for it in its if it["start"] >= t0 and (drained is None or it["end"] < drained)]
    after: list[dict] = []
    if drained is not None:
        after = [it for it in its if it["start"] >= drained][1:]

    def ms(rows: list[dict]) -> float | None:
        return _median([it["duration_s"] * 1000 for it in rows])

    def rt(rows: list[dict]) -> float | None:
        return _median([float(it["retrans_segs"]) for it in rows])

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    return {"link": link, "before_ms": ms(before), "during_ms": ms(during), "after_drain_ms": ms(after),
            "iterations_before": len(before), "iterations_during": len(during), "iterations_after_drain": len(after),
            "retrans_before": rt(before), "retrans_during": rt(during), "retrans_after_drain": rt(after),
            "to_detect_s": since(detect), "to_name_s": since(named), "to_drain_s": since(drained)}
