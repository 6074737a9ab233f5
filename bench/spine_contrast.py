#!/usr/bin/env python3
"""Is a spine's balance noise its own or common to all spines? Live runs against the counter model.

A spine's verdict on ``leafA->spineK`` reads its per-pulse loss-rate estimate for leaf A (its ledger's
``a / b``). Every spine judges leaf A's uplink into it, so if the estimates' noise were common to all
spines (the same flows' retransmissions and pulse boundaries seen everywhere), spine K's estimate less
the mean of the other spines' would cancel it and leave a loss on K's link whole. Per source this prints
the healthy pulses' robust sd (1.4826 x the median absolute deviation) of each spine's estimate on its
own and contrasted that way, the median over (leaf, spine) cells, beside the sd the verdict's noise
model gives one pulse (``1 / sqrt(b)``, "modelled"), and how well that model fits: the root mean square
and the 99th percentile of the pulses' deficits in units of the model's sd (``a / sqrt(b)``; a fitting
model gives about 1 and 2.6 with Gaussian noise):

* live: the shipped recorded runs (tests/data/recorded-runs, 4x4x2; bench/data/timing-2x2x2), the
  pulses before their first fault, every switch's pulses replayed through its detector;
* model: ``analysis.model`` rings (rrdst), 150 healthy pulses per shape and size.

    .venv/bin/python bench/spine_contrast.py
    .venv/bin/python bench/spine_contrast.py --shapes 2x2x1:4 4x4x2:1 --no-live
    .venv/bin/python bench/spine_contrast.py RUN_DIR [RUN_DIR...] --shapes   # experiment runs (--out) alone

A contrast well below the own sd says the noise is common (a contrast of the owners' exported
evidence would localize faster); about sqrt(S / (S - 1)) times the own sd says each spine's is its own.

``--faults``: the same estimates under each run's loss on a ``leafA->spineK`` link (and a model run per
shape with a 2% drop on ``leaf0->spine1`` from pulse 100): the mean over the faulty pulses of spine K's
estimate, of the other spines' mean and of their contrast, and the per-pulse sd of the first and the
last, beside the pulses before the fault's root mean square of both, and the per-pulse sd the verdict
gives spine K's faulty pulses (``sd vdt``: its noise model and the timing term at the fault's rate; about
the faulty pulses' own sd if the verdict's model fits them). Leaf A resends what spine K lost
over every spine, so with S spines sharing alike the others read ``-p / (S - 1)``; a loss downstream of
spine K (``spineK->leafM``, the verdict's other hypothesis) is resent the same way and moves every spine
alike, spine K's own estimate included.

    .venv/bin/python bench/spine_contrast.py --faults

Runtime: about 30 s on one core.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector.verdict import SLACK_S, pulse_variance, timing_share2  # noqa: E402
from analysis.model import ModelSpec  # noqa: E402
from analysis.modelrun import run_model  # noqa: E402
from analysis.replay import judged_run  # noqa: E402
from analysis.rundir import check_replayable  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from pulse_timing import SHIPPED  # noqa: E402  (the shipped live runs, beside this script)

MODEL = ["2x2x1:4", "2x4x2:1", "3x3x2:1", "3x4x1:1", "4x2x2:4", "4x4x2:1", "4x4x1:16"]


def robust_sd(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def cell_rates(detector, cell: int, until: float = math.inf) -> list[tuple[float, float, float]]:
    """A spine's judged pulses of one ledger cell that started before ``until``: (start, rate ``a / b``,
    the sd the verdict's noise model gives it, ``1 / sqrt(b)``)."""
    return [(t, float(a[cell] / b[cell]), float(b[cell]) ** -0.5) for t, a, b, bg, m in detector.owner.ledger.rows
            if t < until and m[cell] and b[cell] > 0]


def same_pulse(rows: list[tuple[float, float, float]], t: float) -> float | None:
    """The rate of the pulse in ``rows`` that started within ``SLACK_S`` of ``t`` (the same iteration's)."""
    best = min(rows, key=lambda x: abs(x[0] - t), default=None)
    return best[1] if best is not None and abs(best[0] - t) <= SLACK_S else None


def model_spec(shape_size: str, seed: int) -> tuple[str, ModelSpec]:
    """``LxSxH:MiB`` as the model's ring (rrdst) and the source's name."""
    shape, size = shape_size.split(":")
    leaves, spines, hosts = (int(x) for x in shape.split("x"))
    return f"model {shape} {size} MiB", ModelSpec(fabric=FabricSpec(leaves=leaves, spines=spines, hosts_per_leaf=hosts),
                                                  size=int(size) << 20, spray="rrdst", seed=seed)


def own_and_contrast(detectors: dict, until: float) -> tuple[float, float, float, float, float, int]:
    """Median over (leaf, spine) cells of the healthy per-pulse rate's robust sd, alone and less the other
    spines' mean, and of the sd the verdict's noise model gives it (``1 / sqrt(b)``), over the pulses
    that started before ``until`` and that every spine judged; the root mean square and 99th percentile
    of every judged healthy pulse's deficit in units of the model's sd; and the pulses counted."""
    spines = sorted(sw for sw, d in detectors.items() if d.owner.ledger is not None)
    ncells = detectors[spines[0]].owner.ledger.ncells
    own, con, modelled, pulses = [], [], [], 0
    zs = np.array([float(a[c] / np.sqrt(b[c])) for s in spines for t, a, b, bg, m in detectors[s].owner.ledger.rows
                   if t < until for c in range(ncells) if m[c] and b[c] > 0])
    fit = (float(np.sqrt(np.mean(zs ** 2))), float(np.percentile(np.abs(zs), 99))) if len(zs) else (np.nan, np.nan)
    for cell in range(ncells):
        judged = [cell_rates(detectors[s], cell, until) for s in spines]
        modelled += [sd for rows_s in judged for _, _, sd in rows_s]
        rows = []
        for t0, r0, _ in sorted(judged[0]):
            match = [same_pulse(rows_s, t0) for rows_s in judged[1:]]
            if all(r is not None for r in match):
                rows.append([r0, *match])
        if len(rows) < 5:
            continue
        rates = np.asarray(rows)
        pulses += len(rates)
        for k in range(len(spines)):
            others = np.delete(rates, k, axis=1).mean(axis=1)
            own.append(robust_sd(rates[:, k]))
            con.append(robust_sd(rates[:, k] - others))
    if not own:
        return float("nan"), float("nan"), float("nan"), *fit, 0
    return float(np.median(own)), float(np.median(con)), float(np.median(modelled)), *fit, pulses


def under_fault(detectors: dict, link: str, start: float, rate: float) -> dict | None:
    """Spine K's estimate on ``leafA->spineK``, the other spines' mean on leaf A's uplinks and their
    contrast, per pulse every spine judged: the faulty pulses' means and sds, the healthy ones' rms; and
    the per-pulse sd the verdict gives spine K's faulty pulses (its noise model plus two boundaries'
    timing at the fault's ``rate``, :func:`agent.detector.verdict.evidence_from`'s per-pulse term), median."""
    src, dst = link.split("->")
    if not (src.startswith("leaf") and dst.startswith("spine")) or dst not in detectors:
        return None
    cell = detectors[dst].owner.owned_cells().get(link)
    others = [sw for sw, d in detectors.items() if sw != dst and d.owner.ledger is not None
              and d.owner.owned_cells().get(f"{src}->{sw}") == cell]
    if cell is None or not others:
        return None
    theirs = [cell_rates(detectors[sw], cell) for sw in others]
    pre, post = [], []
    for t, q, _ in cell_rates(detectors[dst], cell):
        match = [same_pulse(th, t) for th in theirs]
        if any(r is None for r in match):
            continue
        m = float(np.mean(match))
        (post if t >= start - SLACK_S else pre).append((q, m, q - m))
    if len(pre) < 2 or len(post) < 2:
        return None
    share2 = timing_share2(rate)
    verdict_sd = [math.sqrt(pulse_variance(b[cell], bg[cell], share2))
                  for t, a, b, bg, m in detectors[dst].owner.ledger.rows if t >= start - SLACK_S and m[cell] and b[cell] > 0]
    pre_a, post_a = np.asarray(pre), np.asarray(post)
    return {"spines": 1 + len(others), "pre": len(pre_a), "pre_rms_own": float(np.sqrt((pre_a[:, 0] ** 2).mean())),
            "pre_rms_contrast": float(np.sqrt((pre_a[:, 2] ** 2).mean())), "post": len(post_a),
            "own": float(post_a[:, 0].mean()), "others": float(post_a[:, 1].mean()),
            "contrast": float(post_a[:, 2].mean()), "sd_own": float(post_a[:, 0].std(ddof=1)),
            "sd_contrast": float(post_a[:, 2].std(ddof=1)), "sd_verdict": float(np.median(verdict_sd))}


def faults_live(report: Path) -> list[tuple[str, str, float, dict]]:
    judge, spec = judged_run(report.parent)
    f = judge.fabric.spec
    out = []
    for fault in spec["faults"]:
        link = str(fault.get("link") or "")
        rate = float(fault.get("rate") or 0.0)
        if fault.get("start") and (st := under_fault(judge.detectors, link, fault["start"], rate)) is not None:
            out.append((f"live {f.leaves}x{f.spines}x{f.hosts_per_leaf} {report.parent.name}", link,
                        rate, st))
    return out


def faults_model(shape_size: str, seed: int) -> list[tuple[str, str, float, dict]]:
    name, spec = model_spec(shape_size, seed)
    run = run_model(spec, 150, {100: {"drop": {"leaf0->spine1": 0.02}}})
    st = under_fault(run.detectors, "leaf0->spine1", 100, 0.02)
    return [] if st is None else [(name, "leaf0->spine1", 0.02, st)]


def print_faults(rows: list[tuple[str, str, float, dict]]) -> None:
    print(f"{'source':44s} {'link':14s} {'rate':>5s} {'S':>2s} | {'before: n':>9s} {'rms own':>8s} {'rms con':>8s} | "
          f"{'faulty: n':>9s} {'own':>7s} {'others':>7s} {'contrast':>8s} {'sd own':>7s} {'sd con':>7s} {'sd vdt':>7s}")
    for name, link, rate, st in rows:
        print(f"{name:44s} {link:14s} {rate:5.1%} {st['spines']:2d} | {st['pre']:9d} {st['pre_rms_own']:8.2%} "
              f"{st['pre_rms_contrast']:8.2%} | {st['post']:9d} {st['own']:7.2%} {st['others']:7.2%} "
              f"{st['contrast']:8.2%} {st['sd_own']:7.2%} {st['sd_contrast']:7.2%} {st['sd_verdict']:7.2%}")
    for group in sorted({"live " + name.split()[1] if name.startswith("live") else "model" for name, *_ in rows}):
        sel = [(rate, st) for name, _, rate, st in rows if name.startswith(group) and rate > 0]
        if sel:
            shift = [st["others"] * (st["spines"] - 1) / r for r, st in sel]
            ratio = [st["sd_contrast"] / st["sd_own"] for _, st in sel if st["sd_own"] > 0]
            wide = [st["sd_verdict"] / st["sd_own"] for _, st in sel if st["sd_own"] > 0]
            print(f"{group}: under the fault the others' mean x (S - 1) / rate is {np.median(shift):.2f} (-1 expected), "
                  f"sd of the contrast / sd own {np.median(ratio):.2f} (quartiles {np.percentile(ratio, 25):.2f}, "
                  f"{np.percentile(ratio, 75):.2f}); the verdict's per-pulse sd / sd own {np.median(wide):.2f} "
                  f"(quartiles {np.percentile(wide, 25):.2f}, {np.percentile(wide, 75):.2f}) over {len(sel)} faults")


def live(report: Path) -> tuple:
    judge, spec = judged_run(report.parent)
    start = min(f["start"] for f in spec["faults"] if f.get("start"))
    f = judge.fabric.spec
    return (f"live {f.leaves}x{f.spines}x{f.hosts_per_leaf} {report.parent.name}",
            *own_and_contrast(judge.detectors, start))


def model(shape_size: str, seed: int) -> tuple:
    name, spec = model_spec(shape_size, seed)
    run = run_model(spec, 150, {})
    return name, *own_and_contrast(run.detectors, float("inf"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="examples:\n  .venv/bin/python bench/spine_contrast.py\n"
                                        "  .venv/bin/python bench/spine_contrast.py --faults",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path,
                    help="experiment run directories with a fault (default: the shipped ones)")
    ap.add_argument("--shapes", nargs="*", default=MODEL, metavar="LxSxH:MiB", help="model shapes and sizes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-live", action="store_true", help="skip the live runs")
    ap.add_argument("--faults", action="store_true", help="under each run's loss on a leafA->spineK link: spine K's estimate, the other "
                    "spines' mean and their contrast (means and sds over the faulty pulses)")
    args = ap.parse_args(argv)
    for s in args.shapes:
        try:
            shape, size = s.split(":")
            if len(shape.split("x")) != 3 or not all(x.isdigit() and int(x) > 0 for x in [*shape.split("x"), size]):
                raise ValueError
        except ValueError:
            print(f"spine_contrast: bad shape {s!r}: give LxSxH:MiB, e.g. 4x4x2:1", file=sys.stderr)
            return 2
    try:
        check_replayable(*args.runs)
    except SpecError as e:
        print(f"spine_contrast: {e}", file=sys.stderr)
        return 2
    runs = [r / "report.json" for r in args.runs] or SHIPPED
    if args.faults:
        print_faults(([] if args.no_live else [row for r in runs for row in faults_live(r)])
                     + [row for s in args.shapes for row in faults_model(s, args.seed)])
        return 0
    rows = ([] if args.no_live else [live(r) for r in runs]) + [model(s, args.seed) for s in args.shapes]
    print(f"{'source':50s} {'own sd':>8s} {'contrast':>9s} {'ratio':>6s} {'modelled':>9s} {'rms z':>6s} {'p99 z':>6s} "
          f"{'pulses':>7s}")
    for name, own, con, mod, rms, p99, n in rows:
        print(f"{name:50s} {own:8.3%} {con:9.3%} {con / own if own else float('nan'):6.2f} {mod:9.3%} {rms:6.2f} "
              f"{p99:6.1f} {n:7d}")
    groups = sorted({"live " + name.split()[1] if name.startswith("live") else "model" for name, *_ in rows})
    for group in groups:
        ratios = [c / o for name, o, c, *_ in rows if name.startswith(group) and o > 0]
        rms = [r for name, *_, r, _, _ in rows if name.startswith(group)]
        if ratios:
            print(f"{group}: median contrast / own sd {float(np.median(ratios)):.2f} over {len(ratios)} sources "
                  f"(quartiles {np.percentile(ratios, 25):.2f}, {np.percentile(ratios, 75):.2f}); median rms z "
                  f"{float(np.median(rms)):.2f} ({np.percentile(rms, 25):.2f}, {np.percentile(rms, 75):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
