#!/usr/bin/env python3
"""Localization over random faults: the agents' live incidents on model-generated counters.

Each trial draws a fabric shape, a collective size, a fault (directed
leaf-spine link, drop or corruption, rate 0.5-2%; with --host-links also
leaf->host links, drops) and an onset after 20-300
healthy pulses; every switch's own detector judges its counts, and the live
incident tracker (the one ``agent --all`` runs) names links from the alerts and
the owners' verdicts. Reported over all trials:

* detected: a relevant alert after the onset;
* localized within one iteration of detection: an incident naming the faulty
  link at most one pulse after the first relevant alert;
* localized at all (before the trial ends);
* incidents naming a healthy link (must be zero), false alerts;
* for a first alert that points at two links (a leaf's deficit on uplink K: its own ``spineK->leafM`` or
  the upstream ``leafA->spineK``), the owner's information bound: the pulses any test needs on average
  to tell the two apart at the tracker's odds (1/DECIDE_LR wrong either way) from the upstream owner's
  per-pulse evidence at its noise (``agent.detector.verdict.sprt_pulses``, with the owner's per-pulse
  sd of the rate, its ledger's ``1 / sqrt(b)``, median over the fault's pulses). A trial whose bound
  exceeds the owner's pulses by one iteration after detection (detection's pulses plus one) cannot be
  localized that fast by anything that reads the owner's evidence, only by luck. Drops only: a
  corruption is named by the damaged frames its link's owner receives, which needs no verdict.
* beside it, the same bound for a contrast of the spines' evidence (the owner's per-pulse rate less the
  other spines' mean on the same leaf's uplinks; not built), at its healthy per-pulse sd before the
  onset. The model's spines share most of their healthy noise, live ones far less
  (``bench/spine_contrast.py``): this is what a contrast buys in the model, not a live promise.

    python bench/localize.py --trials 100
    python bench/localize.py --trials 20 --shapes 32x64x4 --sizes 64 --onset 250 260   # paper scale

Runtime: 35 s for the 100 trials above on one core.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector.verdict import sprt_pulses  # noqa: E402
from analysis.model import ModelSpec  # noqa: E402
from analysis.modelrun import run_model  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec, Link  # noqa: E402

SHAPES = ["2x2x1", "2x4x2", "3x3x2", "3x4x1", "4x2x2", "4x4x2", "4x4x1"]


def shape(text: str) -> FabricSpec:
    leaves, spines, hosts = (int(x) for x in text.split("x"))
    return FabricSpec(leaves=leaves, spines=spines, hosts_per_leaf=hosts, mtu=9000 if spines > 8 else 1500)


def upstream_cells(fab: Fabric, run, alert: dict) -> list[tuple[str, str, int]] | None:
    """For an alert that points at two links, its upstream candidates that a switch judges: (link, owner,
    ledger cell); None when the alert names its link alone. The upstream candidates' owners must each
    convict (the faulty one) or clear (every one, for a fault on the alerting switch's own link) theirs."""
    ups = [c for c in alert["candidates"] if fab.parse_link(c).dst != alert["switch"]]
    if len(alert["candidates"]) < 2 or not ups:
        return None
    out = []
    for c in ups:
        owner = fab.parse_link(c).dst
        det = run.detectors.get(owner)
        cell = det.owner.owned_cells().get(c) if det else None
        if cell is not None:                 # else no switch judges it (a host's link, out of service)
            out.append((c, owner, cell))
    return out


def worst(bounds: dict[str, float], link: str) -> float | None:
    if not bounds:
        return None
    return bounds[link] if link in bounds else max(bounds.values())


def owner_bound(fab: Fabric, run, alert: dict, link: str, onset: int, rate: float) -> float | None:
    """The owner's information bound for an alert that points at two links (see the module docstring):
    None when the alert names its link alone."""
    bounds = {}
    for c, owner, cell in upstream_cells(fab, run, alert) or []:
        bs = [float(b[cell]) for t, a, b, bg, m in run.detectors[owner].owner.ledger.rows
              if t >= onset and m[cell] and b[cell] > 0]
        bounds[c] = sprt_pulses(rate, 1.0 / math.sqrt(statistics.median(bs))) if bs else math.inf
    return worst(bounds, link)


def contrast_bound(fab: Fabric, run, alert: dict, link: str, onset: int, rate: float) -> float | None:
    """The same bound for a contrast of the owners' evidence (not built: what it would buy): the upstream
    owner's per-pulse rate less the mean of the other spines' rates on the same source leaf's uplinks, at
    the contrast's healthy per-pulse sd (root mean square over the pulses before the onset that every
    spine judged). Noise the spines share cancels in it; the signal is taken as the fault's rate, as for
    the owner's bound. None where no other spine judges the leaf's uplinks."""
    bounds = {}
    for c, owner, cell in upstream_cells(fab, run, alert) or []:
        src = fab.parse_link(c).src
        others = [s for s in fab.spines if s != owner and run.detectors[s].owner.owned_cells().get(f"{src}->{s}") == cell]

        def rates(sw: str) -> dict[float, float]:
            return {round(t, 3): float(a[cell] / b[cell]) for t, a, b, bg, m in run.detectors[sw].owner.ledger.rows
                    if t < onset and m[cell] and b[cell] > 0}
        own, rest = rates(owner), [rates(s) for s in others]
        con = [r - sum(o[t] for o in rest) / len(rest) for t, r in own.items() if rest and all(t in o for o in rest)]
        if len(con) >= 10:
            bounds[c] = sprt_pulses(rate, math.sqrt(sum(x * x for x in con) / len(con)))
    return worst(bounds, link)


def trial(seed: int, shapes: list[str], sizes: list[int], spray: str, onset_range: tuple[int, int],
          after: int, kinds: list[str], host_links: bool = False) -> dict:
    rng = random.Random(seed)
    fs = shape(rng.choice(shapes))
    fab = Fabric(fs)
    pool = fab.fabric_links() + ([Link(leaf, h) for leaf in fab.leaves for h in fab.leaf_hosts(leaf)]
                                 if host_links and fs.hosts_per_leaf >= 2 else [])
    link = rng.choice(pool).name
    kind = rng.choice(kinds) if link.split("->")[1][0] != "h" else "drop"   # the model corrupts fabric links only
    rate = round(rng.uniform(0.005, 0.02), 4)
    onset = rng.randint(*onset_range)
    size = rng.choice(sizes) << 20
    spec = ModelSpec(fabric=fs, size=size, spray=spray, seed=seed, mss=8948 if fs.mtu == 9000 else 1448)
    run = run_model(spec, onset + after, {onset: {"drop" if kind == "drop" else "corrupt": {link: rate}}})
    alerts = [a for a in run.alerts if a["event"] == "alert"]
    rel = [a for a in alerts if a["iteration"] >= onset and (a["link"] == link or link in a["candidates"])]
    false = [a for a in alerts if a not in rel]
    first = min((a["iteration"] for a in rel), default=None)
    first_alert = next((a for a in rel if a["iteration"] == first), None)
    bound = owner_bound(fab, run, first_alert, link, onset, rate) if first_alert and kind == "drop" else None
    cbound = contrast_bound(fab, run, first_alert, link, onset, rate) if bound is not None else None
    named = [e for e in run.incidents if e.get("link") and e["event"] != "resolved"]
    right = [e["iteration"] for e in named if e["link"] == link]
    wrong = sorted({e["link"] for e in named if e["link"] != link})
    return {"seed": seed, "shape": f"{fs.leaves}x{fs.spines}x{fs.hosts_per_leaf}", "size_mib": size >> 20,
            "link": link, "kind": kind, "rate": rate, "onset": onset, "detected": first is not None,
            "iters_to_detect": None if first is None else first - onset + 1,
            "localized": bool(right), "iters_detect_to_localize": None if not right or first is None
            else min(right) - first, "wrong_links": wrong, "false_alerts": len(false),
            "owner_bound_pulses": None if bound is None else round(bound, 1),
            "contrast_bound_pulses": None if cbound is None else round(cbound, 1),
            "owner_pulses_by_one_iteration": None if first is None else first - onset + 2}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="first trial's seed")
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="LxSxH fabric shapes to draw from")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16], help="collective sizes (MiB) to draw from")
    p.add_argument("--spray", default="rrdst", choices=("rrdst", "rr", "random"))
    p.add_argument("--kinds", nargs="+", default=["drop", "corrupt"], choices=("drop", "corrupt"))
    p.add_argument("--onset", type=int, nargs=2, default=(20, 300), metavar=("MIN", "MAX"),
                   help="healthy pulses before the fault")
    p.add_argument("--after", type=int, default=15, help="faulty pulses per trial")
    p.add_argument("--host-links", action="store_true", help="draw leaf->host links too (drops)")
    p.add_argument("--json", action="store_true", help="print every trial as JSON")
    args = p.parse_args()
    rows = []
    t0 = time.time()
    for i in range(args.trials):
        rows.append(trial(args.seed + i, args.shapes, args.sizes, args.spray, tuple(args.onset), args.after, args.kinds,
                          args.host_links))
        r = rows[-1]
        print(f"[{time.time() - t0:5.0f}s] {i + 1}/{args.trials} {r['shape']} {r['size_mib']}MiB {r['kind']} "
              f"{r['rate']:.2%} {r['link']}: detect {r['iters_to_detect']}, localize +{r['iters_detect_to_localize']}"
              + (f" (owner's bound {r['owner_bound_pulses']} pulses, a contrast's {r['contrast_bound_pulses']})"
                 if r["owner_bound_pulses"] is not None else "")
              + (f" WRONG {r['wrong_links']}" if r["wrong_links"] else ""), file=sys.stderr)
    n = len(rows)
    det = [r for r in rows if r["detected"]]
    quick = [r for r in det if r["iters_detect_to_localize"] is not None and r["iters_detect_to_localize"] <= 1]
    lags = [r["iters_detect_to_localize"] for r in det if r["iters_detect_to_localize"] is not None]

    def beyond_bound(r: dict) -> bool:
        return r["owner_bound_pulses"] is not None and r["owner_bound_pulses"] > r["owner_pulses_by_one_iteration"]

    summary = {"trials": n, "spray": args.spray, "detected": len(det),
               "median_iters_to_detect": statistics.median(r["iters_to_detect"] for r in det) if det else None,
               "localized_within_1_iter_of_detection": len(quick),
               "not_within_1_iter_and_bound_needs_more_pulses": sum(beyond_bound(r) for r in det if r not in quick),
               "within_1_iter_though_bound_needs_more_pulses": sum(beyond_bound(r) for r in quick),
               "not_within_1_iter_and_a_contrasts_bound_needs_more": sum(
                   r["contrast_bound_pulses"] is not None and r["contrast_bound_pulses"] > r["owner_pulses_by_one_iteration"]
                   for r in det if r not in quick),
               "localized_by_end": sum(r["localized"] for r in rows),
               "median_detect_to_localize": statistics.median(lags) if lags else None,
               "max_detect_to_localize": max(lags) if lags else None,
               "trials_naming_a_healthy_link": sum(bool(r["wrong_links"]) for r in rows),
               "false_alerts": sum(r["false_alerts"] for r in rows), "seconds": round(time.time() - t0, 1)}
    if args.json:
        print(json.dumps({"summary": summary, "trials": rows}, indent=1))
        return 0
    for k, v in summary.items():
        print(f"{k:38} {v}")
    misses = [r for r in rows if not r["localized"] or r["wrong_links"]]
    for r in misses[:20]:
        print(f"  not localized right: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
