#!/usr/bin/env python3
"""How many iterations live runs take from detection to the named link, and which of the verdict's
noise terms those iterations go to.

A leaf's alert on uplink K for traffic from one source leaf points at two links, and the incident names
one when the upstream owner's verdict passes 100:1 (agent/detector/verdict.py). Its sd has two parts
beside the leaf's own: the spine's noise model (``SPINE_PRIOR``, refined from certified healthy pulses)
and the pulse-timing term (``TIMING_VAR_PER_LOSS``, calibrated on busy 2x2x2 runs). This replays
recorded runs through the agents' detectors and the incident tracker, as shipped and with either term
set otherwise for the replay only (the shipped code is not changed), and prints per variant the runs
named right within one iteration of detection (the issue's measure: iterations begun after the first
alert up to the incident naming the link), named right at all, runs with an incident naming a healthy
link, and false alerts. It also prints how the verdict's per-pulse sd compares with the scatter of the
owner's faulty pulses (upstream faults): about 1 if the verdict's noise model fits them.

    .venv/bin/python bench/verdict_speed.py                      # the shipped 4x4x2 sweep (bench/data)
    .venv/bin/python bench/verdict_speed.py RUN_DIR [RUN_DIR...] --factor 0.02

The variants that shrink a term are not proposals: they say how much of the wait each term costs on
these runs, and nothing about the healthy links they would name elsewhere (busy machines, DDP's
broadcasts, 2x2x2 rings; see docs/concepts/localization.md). Runtime: about 1 s a run and variant.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agent.detector.checks as checks  # noqa: E402
import agent.detector.verdict as verdict  # noqa: E402
from agent.detector import DetectorConfig  # noqa: E402
from analysis.replay import judged_run, replay_dir  # noqa: E402
from analysis.rundir import check_replayable  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402
from netns_testbed.topo import SprayMode  # noqa: E402

SHIPPED = Path(__file__).resolve().parent / "data" / "sweep-4x4x2"


def variant(runs: list[Path], timing: float, factor: float) -> dict:
    """Every run replayed with the verdict's timing ratio and the rrdst spine noise prior set so."""
    saved = verdict.TIMING_VAR_PER_LOSS, dict(checks.SPINE_PRIOR)
    verdict.TIMING_VAR_PER_LOSS = timing
    for mode in (SprayMode.RR, SprayMode.RRDST):       # the round-robin modes share the prior
        checks.SPINE_PRIOR[mode] = factor
    try:
        lags, named, healthy, false = [], 0, 0, 0
        for run in runs:
            det = replay_dir(run, DetectorConfig())["detection"]
            pf = det["per_fault"][0] if det["per_fault"] else {}
            lags.append(pf.get("iterations_detect_to_localize"))
            named += bool(pf.get("localization_correct"))
            healthy += bool(det["incidents_naming_healthy_links"])
            false += det["false_positives"]
    finally:
        verdict.TIMING_VAR_PER_LOSS = saved[0]
        checks.SPINE_PRIOR.clear()
        checks.SPINE_PRIOR.update(saved[1])
    return {"within_1": sum(x is not None and x <= 1 for x in lags), "named": named, "healthy_named": healthy,
            "false_alerts": false, "lags": lags}


def fit(run: Path) -> float | None:
    """The verdict's per-pulse sd (noise model and timing at the fault's rate) over the root mean square
    of the owner's faulty pulses about the fault's rate, for a drop on a leaf->spine link; else None."""
    judge, rep = judged_run(run)
    f = rep["faults"][0]
    link = judge.fabric.parse_link(f["link"])
    if not (link.src.startswith("leaf") and f["kind"] == "drop"):
        return None
    det = judge.detectors[link.dst]
    cell = det.owner.owned_cells()[f["link"]]
    share2 = verdict.timing_share2(f["rate"])
    res, sd = [], []
    for t, a, b, bg, m in det.owner.ledger.rows:
        if t >= f["start"] + verdict.SLACK_S and m[cell] and b[cell] > 0 and (not f.get("end") or t < f["end"]):
            res.append(a[cell] / b[cell] - f["rate"])
            sd.append(math.sqrt(verdict.pulse_variance(b[cell], bg[cell], share2)))
    if len(res) < 3:
        return None
    return statistics.median(sd) / math.sqrt(sum(x * x for x in res) / len(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="examples:\n  .venv/bin/python bench/verdict_speed.py\n"
                                        "  .venv/bin/python bench/verdict_speed.py runs/sweep/0* --factor 0.02",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="experiment run directories with one fault each "
                    "(default: the shipped 4x4x2 sweep)")
    ap.add_argument("--factor", type=float, default=0.011,
                    help="the spine noise prior (rr and rrdst) of the variants that set it (default 0.011, the "
                         "recorded rrdst trace's spine balance factor; the shipped prior is 0.06)")
    args = ap.parse_args(argv)
    if not args.factor > 0:
        print("verdict_speed: --factor must be > 0, e.g. 0.011", file=sys.stderr)
        return 2
    runs = args.runs or sorted(p for p in SHIPPED.iterdir() if p.is_dir())
    try:
        check_replayable(*runs)
    except SpecError as e:
        print(f"verdict_speed: {e}", file=sys.stderr)
        return 2
    shipped = checks.SPINE_PRIOR[SprayMode.RRDST]
    rows = [("as shipped", verdict.TIMING_VAR_PER_LOSS, shipped),
            ("no timing term", 0.0, shipped),
            (f"spine factor {args.factor:g}", verdict.TIMING_VAR_PER_LOSS, args.factor),
            ("both", 0.0, args.factor)]
    print(f"{len(runs)} runs; timing ratio shipped {verdict.TIMING_VAR_PER_LOSS:g}, spine factor shipped {shipped:g}",
          file=sys.stderr)
    print(f"{'variant':22s} {'within 1 iter':>13s} {'named':>6s} {'healthy named':>13s} {'false alerts':>12s}  "
          "iterations from detection to the named link, per run")
    for name, timing, factor in rows:
        v = variant(runs, timing, factor)
        print(f"{name:22s} {v['within_1']:13d} {v['named']:6d} {v['healthy_named']:13d} {v['false_alerts']:12d}  "
              + " ".join("-" if x is None else str(x) for x in v["lags"]), flush=True)
    ratios = [x for x in (fit(r) for r in runs) if x is not None]
    if ratios:
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"verdict's per-pulse sd / the owner's faulty pulses' rms about the rate (upstream drops, shipped "
              f"terms): median {statistics.median(ratios):.2f} (quartiles {q[0]:.2f}, {q[2]:.2f}) over {len(ratios)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
