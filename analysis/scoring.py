"""Score alerts against the injected truth: the ``detection`` part of report.json."""
from __future__ import annotations

SLACK_S = 0.05  # clock slack between the fault switch-on and pulse stamps


def _iteration_of(iterations: list[dict], t: float) -> int | None:
    for it in iterations:
        if it["start"] - SLACK_S <= t <= it["end"] + SLACK_S:
            return it["index"]
    later = [it["index"] for it in iterations if it["start"] > t]
    return later[0] - 1 if later else (iterations[-1]["index"] if iterations else None)


def relevant(alert: dict, fault: dict) -> bool:
    if alert["time"] < fault["start"] - SLACK_S:
        return False
    if fault.get("end") and alert.get("pulse_start", alert["time"]) > fault["end"] + 1.0:
        return False
    return fault["link"] == alert.get("link") or fault["link"] in alert.get("candidates", [])


def detection_summary(faults: list[dict], alerts: list[dict], iterations: list[dict],
                      incidents: list[dict]) -> dict:
    """True/false positives, missed faults, time and iterations to detect, localisation."""
    per_fault = []
    used: set[int] = set()
    for f in faults:
        rel = [(i, a) for i, a in enumerate(alerts) if relevant(a, f)]
        used.update(i for i, _ in rel)
        row = {"link": f["link"], "kind": f["kind"], "rate": f["rate"], "detected": bool(rel)}
        first_faulty = next((it["index"] for it in iterations if it["start"] >= f["start"] - SLACK_S), None)
        if rel:
            a = min((a for _, a in rel), key=lambda a: a["time"])
            it = _iteration_of(iterations, a.get("pulse_start", a["time"]))
            row.update({
                "first_alert": {k: a.get(k) for k in ("switch", "port", "link", "candidates", "estimated_rate", "score",
                                                      "time")},
                "seconds_to_detect": round(a["time"] - f["start"], 3),
                # 1: caught in the first iteration wholly under the fault, or in the tail of the one before
                # it that the fault switched on during (rank 0 ends an iteration before the others do, so a
                # fault due "before iteration K" can reach K-1's last packets: never 0, which reads as
                # "before the fault")
                "iterations_to_detect": max(1, it - first_faulty + 1) if it is not None and first_faulty is not None
                else None,
                "first_alert_names_link": a.get("link") == f["link"],
                "first_alert_candidates_hold_link": f["link"] in a.get("candidates", []),
            })
            # the incident of this fault: the one naming its link, else one that still has it as a candidate
            inc = next((x for x in incidents if x.get("link") == f["link"]), None) or \
                next((x for x in incidents if f["link"] in x["candidates"]), None)
            row["localized_link"] = inc.get("link") if inc else None
            row["localization_correct"] = bool(inc and inc.get("link") == f["link"])
            row["localization_how"] = inc["how"] if inc else None
            named = inc.get("localized_time") if inc and row["localization_correct"] else None
            row["seconds_to_localize"] = round(named - f["start"], 3) if named else None
            # iterations that began after the first alert was raised, up to the incident naming the link:
            # 0 = named before the next iteration began, 1 = within one iteration of detection
            row["iterations_detect_to_localize"] = sum(1 for it in iterations if a["time"] < it["start"] <= named) \
                if named else None
        else:
            row.update({"localized_link": None, "localization_correct": False, "iterations_to_detect": None,
                        "seconds_to_detect": None})
        per_fault.append(row)
    false_alerts = [a for i, a in enumerate(alerts) if i not in used]
    healthy_iters = len(iterations)
    if faults:
        t0 = min(f["start"] for f in faults)
        healthy_iters = sum(1 for it in iterations if it["end"] < t0)
    detected = [r for r in per_fault if r["detected"]]
    truth = {f["link"] for f in faults}
    return {
        "faults": len(faults),
        "incidents_naming_healthy_links": sorted({i["link"] for i in incidents if i.get("link") and i["link"] not in truth}),
        "true_positives": len(detected),
        "missed_faults": len(faults) - len(detected),
        "false_positives": len(false_alerts),
        "false_alerts": [{k: a.get(k) for k in ("switch", "port", "link", "candidates", "score", "time")}
                         for a in false_alerts],
        "healthy_iterations": healthy_iters,
        "localization_correct": sum(1 for r in per_fault if r.get("localization_correct")),
        "per_fault": per_fault,
    }
