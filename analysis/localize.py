"""Fabric-level view of the switches' local alerts: one incident per fault, one link.

Detection is local: every alert comes from one switch's own counters. Most
alerts name one link (a spine's deficit on its port from leaf L is on
``leafL->spineK``; damaged frames arriving on a port are on its incoming link).
A leaf's deficit on uplink K for traffic from leaf L has two candidates,
``spineK->leafM`` and ``leafL->spineK``, and with one dominant source (a ring)
the leaf alone cannot tell them apart quickly. This module settles it the way an
operator's alert pipeline would: with what spine K itself publishes about its
port from leaf L. If leafL->spineK drops, spine K receives about the leaf's
deficit D fewer packets from L than in its healthy pulses; if spineK->leafM
drops, spine K's share from L is intact (re-sprayed retransmissions even add a little). A
likelihood ratio between the two, on spine K's own per-pulse counts, decides.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from agent.pulse import PulseCounts
from netns_testbed.topo import Fabric, node_kind, node_num

DECIDE_LLR = math.log(100.0)
MODEL_ERROR = 0.2


@dataclass
class Incident:
    alert_ids: list[str]
    switches: list[str]
    kind: str
    candidates: list[str]
    link: str | None
    how: str
    first_time: float
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _groups(alerts: list[dict]) -> list[list[dict]]:
    """Alerts whose candidate links overlap belong to one incident (union-find)."""
    parent = list(range(len(alerts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, a in enumerate(alerts):
        for link in a["candidates"] + ([a["link"]] if a.get("link") else []):
            if link in owner:
                parent[find(i)] = find(owner[link])
            else:
                owner[link] = i
    out: dict[int, list[dict]] = {}
    for i, a in enumerate(alerts):
        out.setdefault(find(i), []).append(a)
    return list(out.values())


def spine_test(fabric: Fabric, spine_pulses: list[PulseCounts], leaf_alert: dict,
               leaf_pulses: list[PulseCounts] | None = None, min_total: int = 500) -> tuple[str | None, dict]:
    """Decide between the two candidates of a leaf alert with spine K's own pulses.

    Uses the share of spine K's ingress that arrives from leaf L: immune to
    pulses that split (an RTO stall inside an iteration) and to workload size.
    Pulses are aligned by time with the leaf alert's evidence window; given the
    leaf's published pulses, the window runs from the alert's onset to the end
    of the record, and the leaf's deficit is recomputed over that same span.
    """
    src_leaf = leaf_alert["evidence"].get("source")
    if not src_leaf or not spine_pulses:
        return None, {}
    port = node_num(src_leaf)
    src = port + 1
    t_start = leaf_alert["evidence"].get("window_start", leaf_alert.get("pulse_start", leaf_alert["time"]))
    t_end = leaf_alert["time"]
    d_leaf = float(leaf_alert["evidence"].get("deficit", 0.0))
    if leaf_pulses:
        shares = fabric.spray_shares(src_leaf, leaf_alert["switch"])
        w = shares.get(leaf_alert["ifname"], 0.0)
        span = [p for p in leaf_pulses if p.start_time >= t_start - 0.05 and p.total >= min_total]
        if w > 0 and span:
            ups = fabric.spec.spines
            d_leaf = float(sum(w * p.ip[:ups, 0, src].sum() - p.ip[leaf_alert["port"], 0, src] for p in span))
            t_end = max(p.end_time for p in span)
    usable = [p for p in spine_pulses if p.total >= min_total]
    before = [p for p in usable if p.end_time < t_start - 0.05][3:]  # skip connection set-up pulses
    during = [p for p in usable if p.start_time >= t_start - 0.05 and p.end_time <= t_end + 0.05]
    if len(before) < 6 or not during:
        return None, {"reason": "too few spine pulses"}
    shares = np.array([p.ip[port, 0, src] / p.total for p in before])
    s_mu = float(np.median(shares))
    s_sd = max(float(np.median(np.abs(shares - s_mu))) * 1.4826, float(np.std(shares)), 1e-4)
    totals = np.array([p.total for p in during], dtype=float)
    observed = float(sum(p.ip[port, 0, src] for p in during))
    deficit = s_mu * totals.sum() - observed
    # spine noise, plus model error: retransmissions and ACK shifts move the spine's
    # shares by a fraction of the leaf's deficit (MODEL_ERROR of it, one sd)
    var = float(np.sum((s_sd * totals) ** 2)) + (MODEL_ERROR * d_leaf) ** 2 + 1.0
    mean_a = d_leaf                               # leaf L -> spine K drops: spine K misses them too
    mean_b = 0.0                                  # spine K -> leaf M drops: spine K's share is intact
    llr = ((deficit - mean_b) ** 2 - (deficit - mean_a) ** 2) / (2 * var)
    ev = {"spine_deficit": round(deficit, 1), "leaf_deficit": round(d_leaf, 1), "spine_sd": round(var ** 0.5, 2),
          "spine_pulses": len(during), "llr_upstream": round(llr, 2)}
    spine = leaf_alert["ifname"]
    if llr > DECIDE_LLR:
        return f"{src_leaf}->{spine}", ev
    if llr < -DECIDE_LLR:
        return f"{spine}->{leaf_alert['switch']}", ev
    return None, ev


def latest_events(events: list[dict]) -> dict[str, dict]:
    """alert_id -> its last alert or update event (updates carry more evidence and may
    have resolved the link)."""
    return {ev["alert_id"]: ev for ev in events if ev["event"] != "resolved"}


def incidents(fabric: Fabric, events: list[dict], pulses: dict[str, list[PulseCounts]] | None = None) -> list[Incident]:
    """Group alert events into incidents and name one link for each where the evidence allows."""
    first: dict[str, dict] = {}
    for ev in events:
        if ev["event"] != "resolved":
            first.setdefault(ev["alert_id"], ev)
    alerts = list(latest_events(events).values())
    out = []
    for group in _groups(alerts):
        definite = [a["link"] for a in group if a.get("link")]
        cands = sorted(set.intersection(*(set(a["candidates"]) for a in group)))
        kind = "corruption" if any(a["kind"] == "corruption" for a in group) else "loss"
        t0 = min(first[a["alert_id"]]["time"] for a in group)
        link, how, evidence = None, "", {}
        if definite:
            votes = {l: definite.count(l) for l in set(definite)}
            link = max(votes, key=lambda l: (votes[l], l in cands))
            how = "named by " + ", ".join(sorted({a["switch"] for a in group if a.get("link") == link}))
        elif len(cands) == 1:
            link, how = cands[0], "only common candidate"
        else:
            leaf_alerts = sorted((a for a in group if node_kind(a["switch"]) == "leaf"), key=lambda a: -a["window"])
            for a in leaf_alerts:
                spine = a["ifname"]
                decided, evidence = spine_test(fabric, (pulses or {}).get(spine, []), a,
                                               (pulses or {}).get(a["switch"]))
                if decided:
                    link, how = decided, f"{spine}'s own counts ({'deficit' if decided.endswith(spine) else 'no deficit'} on its port from {a['evidence'].get('source')})"
                    break
            if link is None:
                how = "ambiguous between " + " and ".join(cands or sorted({c for a in group for c in a["candidates"]}))
        out.append(Incident(sorted(a["alert_id"] for a in group), sorted({a["switch"] for a in group}), kind,
                            cands or sorted({c for a in group for c in a["candidates"]}), link, how, t0, evidence))
    return sorted(out, key=lambda i: i.first_time)
