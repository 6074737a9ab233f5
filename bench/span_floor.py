#!/usr/bin/env python3
"""The owner's evidence against the counting floor: the same-packet reference, the balance and the binomial.

An owner judges the link into its port from what that port received. Two estimates of the loss rate
per pulse, per directed leaf-spine link, from recorded live runs (`flowpulse experiment` or `sweep`
``--out``, made by a datapath that keeps sequence spans, bpf/switch.h ``struct fp_span``):

* ``span``: the same-packet reference. Per (port, remote leaf) the port's new bytes against the
  spray share of its flows' sequence spans: ``1 - new / (share x span)`` (bytes). A spine judges
  ``leafX->spineK`` (its port from leaf X, every destination leaf's flows); a leaf judges the path
  ``leafX->spineK->leafM`` (its uplink K, flows from leaf X).
* ``balance``: the spine's verdict ledger today (a leaf's fabric inflow against its outflow:
  different packets), ``a / b`` per pulse (spines only).

For the pulses before each run's fault ("healthy") it prints per estimate the robust sd
(1.4826 x MAD) and the rms, the median over cells; beside it the binomial floor at 0.5%, 1% and 2%
(``sqrt(p (1 - p) / n)`` with ``n`` the cell's data segments per pulse: the noise of the loss itself,
which no estimate of the same packets goes below). For the faulty link of each run, the faulty
pulses' mean and sd of both estimates against the fault's rate, and the pulses Wald's SPRT needs at
100:1 (``9 sd^2 / p^2``; one pulse is the best there is).

    .venv/bin/python bench/span_floor.py RUN_DIR [RUN_DIR ...]
    .venv/bin/python bench/span_floor.py runs/sweep/*          # a sweep's runs

Runtime: a few seconds per run on one core.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector.config import DetectorConfig  # noqa: E402
from agent.detector.switch import RESHARE_SETTLE_NS  # noqa: E402
from agent.feed import Judge  # noqa: E402
from analysis.replay import in_time_order, spray_changes  # noqa: E402
from analysis.rundir import check_replayable, load_pulses  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec, SprayMode, node_kind  # noqa: E402
from agent.pulse import SPAN_BYTES, SPAN_FIRST, SPAN_NEW  # noqa: E402



def robust_sd(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else math.nan


def span_rates(fabric: Fabric, switch: str, pulses) -> dict[str, list[tuple[float, float, float]]]:
    """Per directed link (a spine's ``leafX->spineK``, a leaf's path ``leafX->spineK->leafM``): per pulse
    (start time, loss-rate estimate ``r / e``, data segments expected ``e``), as the switch's detector
    reads them (agent.detector.checks.span_samples: SpineCheck's per port, PeerCheck's per path)."""
    from agent.detector.checks import PeerCheck, SpineCheck
    spine = node_kind(switch) == "spine"
    chk = (SpineCheck if spine else PeerCheck)(fabric, switch, SprayMode.RRDST, DetectorConfig(), {}, [], set())
    out: dict[str, list[tuple[float, float, float]]] = {}
    for pc in pulses:
        if pc.span is None:
            continue
        smp = chk._span(pc)[0] if spine else chk.samples(pc).path
        for cell in zip(*np.nonzero(smp.mask)):
            name = f"leaf{cell[0]}->{switch}" if spine else f"leaf{cell[0]}->spine{cell[1]}->{switch}"
            out.setdefault(name, []).append((pc.start_time, float(smp.r[cell] / smp.s[cell]), float(smp.s[cell])))
    return out


def noise_samples(fabric: Fabric, switch: str, pulses, onset: float) -> list[tuple[float, float, float]]:
    """A spine's healthy cells (before ``onset``) as (r^2, e, R): the squared deficit in segments, the
    segments expected and the resent ones (agent.detector.noise.SpanNoise's terms)."""
    from agent.detector.checks import SpineCheck
    chk = SpineCheck(fabric, switch, SprayMode.RRDST, DetectorConfig(), {}, [], set())
    out = []
    for pc in pulses:
        if pc.span is None or pc.start_time >= onset - 0.05:
            continue
        smp = chk._span(pc)[0]
        for x in np.flatnonzero(smp.mask):
            out.append((float(smp.r[x]) ** 2, float(smp.u[x, 0]), float(smp.u[x, 1])))
    return out


def balance_rates(det, fabric: Fabric, switch: str) -> dict[str, list[tuple[float, float]]]:
    """The spine's verdict ledger per pulse (start, ``a / b``), as its detector replayed it."""
    out: dict[str, list[tuple[float, float]]] = {}
    for t, a, b, _, msk in det.owner.ledger.rows:
        for x in range(fabric.spec.leaves):
            if msk[x] and b[x] > 0:
                out.setdefault(f"leaf{x}->{switch}", []).append((t, float(a[x] / b[x])))
    return out


def balance_judge(rep: dict, pulses: dict) -> Judge:
    """Every switch's pulses replayed with their spans left out: the spines judge by the balance."""
    spec = rep["spec"]
    fabric = Fabric(FabricSpec.from_dict(spec["fabric"]))
    judge = Judge(fabric, DetectorConfig(), SprayMode.parse(spec["spray"]),
                  fabric.parse_link_list(spec.get("out_of_service")))
    for pc in in_time_order(pulses):
        judge.observe(dataclasses.replace(pc, span=None))
    return judge


SIZE_BINS = ((20, 200), (200, 1000), (1000, 3000), (3000, math.inf))


def dest_cells(fabric: Fabric, pulses, onset: float) -> list[tuple[float, float]]:
    """A spine's cells per source leaf (port) and destination leaf, healthy pulses: per cell with at least
    five pulses of 20 segments expected, (mean segments expected, sd of expected - seen), in segments.
    What ``verdict.DEST_MIN_SEGMENTS`` rests on: the noise model against cells of each size."""
    w = 1.0 / len(fabric.spines)
    out = []
    rows = [pc.span for pc in pulses if pc.span is not None and pc.end_time < onset]
    if len(rows) < 5:
        return out
    L = len(fabric.leaves)
    sp = np.array([r[:L, 1:L + 1, :] for r in rows], dtype=float)    # pulse, port (source), destination, field
    first, new_b, span = sp[..., SPAN_FIRST], sp[..., SPAN_NEW], sp[..., SPAN_BYTES]
    seg = np.divide(new_b, first, out=np.ones_like(new_b), where=first > 0)
    e = w * span / seg
    d = e - first
    for a in range(L):
        for b in range(L):
            m = e[:, a, b] >= 20
            if m.sum() >= 5:
                out.append((float(e[m, a, b].mean()), float(d[m, a, b].std())))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: .venv/bin/python bench/span_floor.py runs/sweep/*")
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (report.json and pulses/)")
    ap.add_argument("--no-balance", action="store_true", help="leave the balance (a replay per run) out")
    args = ap.parse_args(argv)
    try:
        check_replayable(*args.runs)
    except SpecError as e:
        print(f"span_floor: {e}", file=sys.stderr)
        return 2
    healthy: dict[str, list[float]] = {"span (spine)": [], "span (leaf path)": [], "balance (spine)": [],
                                       "rms span (spine)": [], "rms balance (spine)": []}
    segs_per_pulse: list[float] = []
    noise: list[tuple[float, float, float]] = []
    cells: list[tuple[float, float]] = []
    faulty_rows = []
    for run in args.runs:
        rep = json.loads((run / "report.json").read_text())
        fabric = Fabric(FabricSpec.from_dict(rep["spec"]["fabric"]))
        faults = rep.get("faults", [])
        onset = min((f["start"] for f in faults), default=math.inf)
        pulses = load_pulses(run / "pulses")
        changes = spray_changes(run, rep, fabric)
        if changes:
            # every cell here is read by the build's shares: a mitigated run's pulses from its first spray
            # change on (a canary's quarter share reads as a loss of three quarters) are left out
            cut = min(c.t0_ns for c in changes) - RESHARE_SETTLE_NS
            kept = {sw: [pc for pc in ps if pc.end_ns < cut] for sw, ps in pulses.items()}
            print(f"span_floor: {run.name}: {sum(map(len, pulses.values())) - sum(map(len, kept.values()))} pulses "
                  f"from its first spray change ({changes[0].action} {', '.join(l.name for l in changes[0].links)}) "
                  "on left out", file=sys.stderr)
            pulses = kept
        if not any(pc.span is not None for ps in pulses.values() for pc in ps):
            print(f"span_floor: {run} has no sequence spans (recorded by an older datapath)", file=sys.stderr)
            return 2
        for sw, ps in pulses.items():
            if node_kind(sw) == "spine":
                noise += noise_samples(fabric, sw, ps, onset)
                cells += dest_cells(fabric, ps, onset)
        fault_links = {f["link"]: f for f in faults}
        judge = None if args.no_balance else balance_judge(rep, pulses)
        for sw, ps in pulses.items():
            sr = span_rates(fabric, sw, ps)
            br = balance_rates(judge.detectors[sw], fabric, sw) if judge and node_kind(sw) == "spine" else {}
            for link, rows in sr.items():
                h = np.array([r for t, r, _ in rows if t < onset - 0.05])
                if len(h) >= 5:
                    key = "span (spine)" if node_kind(sw) == "spine" else "span (leaf path)"
                    healthy[key].append(robust_sd(h))
                    if node_kind(sw) == "spine":
                        healthy["rms span (spine)"].append(float(np.sqrt(np.mean(h ** 2))))
                        segs_per_pulse.append(float(np.median([n for t, _, n in rows if t < onset - 0.05])))
            for link, rows in br.items():
                h = np.array([r for t, r in rows if t < onset - 0.05])
                if len(h) >= 5:
                    healthy["balance (spine)"].append(robust_sd(h))
                    healthy["rms balance (spine)"].append(float(np.sqrt(np.mean(h ** 2))))
            for link, f in fault_links.items():
                if link not in sr:
                    continue
                fr = np.array([r for t, r, _ in sr[link] if f["start"] + 0.05 <= t < f.get("end", math.inf)])
                bal = np.array([r for t, r in br.get(link, []) if f["start"] + 0.05 <= t < f.get("end", math.inf)])
                if len(fr):
                    sd = float(np.std(fr, ddof=1)) if len(fr) > 1 else math.nan
                    faulty_rows.append((run.name, link, f["rate"], len(fr), float(np.mean(fr)), sd,
                                        float(np.mean(bal)) if len(bal) else math.nan,
                                        float(np.std(bal, ddof=1)) if len(bal) > 1 else math.nan))
    n = float(np.median(segs_per_pulse)) if segs_per_pulse else math.nan
    print(f"healthy pulses, per-pulse loss-rate estimate, median over cells ({len(args.runs)} runs; "
          f"a spine port's data segments per pulse: {n:.0f})")
    for key, vals in healthy.items():
        if vals:
            q = np.percentile(vals, [25, 50, 75])
            print(f"  {key:22s} {100 * q[1]:.3f}%  (quartiles {100 * q[0]:.3f}%, {100 * q[2]:.3f}%; {len(vals)} cells)")
    for p in (0.005, 0.01, 0.02):
        print(f"  binomial floor at {100 * p:.1f}%: {100 * math.sqrt(p * (1 - p) / n):.3f}%")
    if noise:
        r2, e, R = (np.array(x) for x in zip(*noise))
        quiet = R <= 0
        phi_e = float(np.mean(r2[quiet] / e[quiet]))
        phi_r = float(np.mean((r2[~quiet] - phi_e * e[~quiet]) / R[~quiet])) if (~quiet).any() else math.nan
        print(f"  noise factors of the spines' reference (SpanNoise: V = phi_e e + phi_r R): phi_e {phi_e:.4f} "
              f"({int(quiet.sum())} cells without resent segments), phi_r {phi_r:.2f} ({int((~quiet).sum())} with)")
    if cells and noise:
        ce, csd = (np.array(x) for x in zip(*cells))
        print("  a spine's cells per source and destination leaf, healthy sd of expected - seen (segments) against"
              " the model's sqrt(phi_e e):")
        for lo, hi in SIZE_BINS:
            m = (ce >= lo) & (ce < hi)
            if m.any():
                print(f"    {lo:>5}-{hi:<5} segments a pulse: {int(m.sum()):4d} cells, sd {np.median(csd[m]):.2f} "
                      f"against {math.sqrt(phi_e * np.median(ce[m])):.2f}")
    if faulty_rows:
        print("\nfaulty link, faulty pulses: estimate mean / sd per pulse (span; balance), SPRT pulses at 100:1 (span)")
        print(f"  {'run':34s} {'link':16s} {'p':>6s} {'n':>3s} {'span':>8s} {'sd':>7s} {'bal':>8s} {'sd':>7s} {'sprt':>5s}")
        for name, link, p, k, m, sd, bm, bsd in faulty_rows:
            sprt = 9 * sd * sd / (p * p) if sd == sd else math.nan
            print(f"  {name[:34]:34s} {link:16s} {100 * p:5.2f}% {k:3d} {100 * m:7.3f}% {100 * sd:6.3f}% "
                  f"{100 * bm:7.3f}% {100 * bsd:6.3f}% {sprt:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
