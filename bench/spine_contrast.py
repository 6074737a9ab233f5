#!/usr/bin/env python3
"""Is a spine's balance noise its own or common to all spines? Live runs against the counter model.

A spine's verdict on ``leafA->spineK`` reads its per-pulse loss-rate estimate for leaf A (its ledger's
``a / b``). Every spine judges leaf A's uplink into it, so if the estimates' noise were common to all
spines (the same flows' retransmissions and pulse boundaries seen everywhere), spine K's estimate less
the mean of the other spines' would cancel it and leave a loss on K's link whole. Per source this prints
the healthy pulses' robust sd (1.4826 x the median absolute deviation) of each spine's estimate on its
own and contrasted that way, the median over (leaf, spine) cells, beside the sd the verdict's noise
model gives one pulse (``1 / sqrt(b)``, "modelled"):

* live: the shipped recorded runs (tests/data/recorded-runs, 4x4x2; bench/data/timing-2x2x2), the
  pulses before their first fault, every switch's pulses replayed through its detector;
* model: ``analysis.model`` rings (rrdst), 150 healthy pulses per shape and size.

    .venv/bin/python bench/spine_contrast.py
    .venv/bin/python bench/spine_contrast.py --shapes 2x2x1:4 4x4x2:1 --no-live
    .venv/bin/python bench/spine_contrast.py RUN_DIR [RUN_DIR...] --shapes   # experiment runs (--out) alone

A contrast well below the own sd says the noise is common (a contrast of the owners' exported
evidence would localize faster); about sqrt(S / (S - 1)) times the own sd says each spine's is its own.
Runtime: about 30 s on one core.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.detector.verdict import SLACK_S  # noqa: E402
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


def own_and_contrast(detectors: dict, until: float) -> tuple[float, float, float, int]:
    """Median over (leaf, spine) cells of the healthy per-pulse rate's robust sd, alone and less the other
    spines' mean, and of the sd the verdict's noise model gives it (``1 / sqrt(b)``), over the pulses
    that started before ``until`` and that every spine judged; and the pulses counted."""
    spines = sorted(sw for sw, d in detectors.items() if d.ledger is not None)
    ncells = detectors[spines[0]].ledger.ncells
    own, con, modelled, pulses = [], [], [], 0
    for cell in range(ncells):
        judged = [[(t, float(a[cell] / b[cell]), float(b[cell]) ** -0.5) for t, a, b, bg, m in detectors[s].ledger.rows
                   if t < until and m[cell] and b[cell] > 0] for s in spines]
        modelled += [sd for rows_s in judged for _, _, sd in rows_s]
        per = [{t: r for t, r, _ in rows_s} for rows_s in judged]
        rows = []
        for t0, r0 in sorted(per[0].items()):
            match = [next((r for t, r in p.items() if abs(t - t0) <= SLACK_S), None) for p in per[1:]]
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
        return float("nan"), float("nan"), float("nan"), 0
    return float(np.median(own)), float(np.median(con)), float(np.median(modelled)), pulses


def live(report: Path) -> tuple[str, float, float, float, int]:
    judge, spec = judged_run(report.parent)
    start = min(f["start"] for f in spec["faults"] if f.get("start"))
    f = judge.fabric.spec
    return (f"live {f.leaves}x{f.spines}x{f.hosts_per_leaf} {report.parent.name}",
            *own_and_contrast(judge.detectors, start))


def model(shape_size: str, seed: int) -> tuple[str, float, float, float, int]:
    shape, size = shape_size.split(":")
    leaves, spines, hosts = (int(x) for x in shape.split("x"))
    spec = ModelSpec(fabric=FabricSpec(leaves=leaves, spines=spines, hosts_per_leaf=hosts), size=int(size) << 20,
                     spray="rrdst", seed=seed)
    run = run_model(spec, 150, {})
    return f"model {shape} {size} MiB", *own_and_contrast(run.detectors, float("inf"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: .venv/bin/python bench/spine_contrast.py",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path,
                    help="experiment run directories with a fault (default: the shipped ones)")
    ap.add_argument("--shapes", nargs="*", default=MODEL, metavar="LxSxH:MiB", help="model shapes and sizes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-live", action="store_true", help="skip the live runs")
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
        for r in args.runs:
            check_replayable(r)
    except SpecError as e:
        print(f"spine_contrast: {e}", file=sys.stderr)
        return 2
    runs = [r / "report.json" for r in args.runs] or SHIPPED
    rows = ([] if args.no_live else [live(r) for r in runs]) + [model(s, args.seed) for s in args.shapes]
    print(f"{'source':50s} {'own sd':>8s} {'contrast':>9s} {'ratio':>6s} {'modelled':>9s} {'pulses':>7s}")
    for name, own, con, mod, n in rows:
        print(f"{name:50s} {own:8.3%} {con:9.3%} {con / own if own else float('nan'):6.2f} {mod:9.3%} {n:7d}")
    groups = sorted({"live " + name.split()[1] if name.startswith("live") else "model" for name, *_ in rows})
    for group in groups:
        ratios = [c / o for name, o, c, _, n in rows if name.startswith(group) and o > 0]
        if ratios:
            print(f"{group}: median contrast / own sd {float(np.median(ratios)):.2f} over {len(ratios)} sources "
                  f"(quartiles {np.percentile(ratios, 25):.2f}, {np.percentile(ratios, 75):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
