"""``flowpulse sweep``: a grid of experiments and the headline table, with baselines."""
from __future__ import annotations

import argparse
import json
import sys

from flowpulse.cmdbase import Formatter, emit, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="grid over fault kind, rate, link and seed, with baselines",
                       formatter_class=Formatter,
                       epilog="example (about 35 s per run on 2 cores):\n"
                              "  sudo flowpulse sweep --kinds drop,corrupt --rates 0.005,0.01,0.02 --links 2 --out runs/sweep\n"
                              "  sudo flowpulse sweep --kinds partial --rates 0.25,0.5 --links 4 --mitigate --out runs/partial\n"
                              "Writes sweep.json (one row per run), table.json and sweep.png; each run keeps its directory.")
    from flowpulse.cmd_experiment import add_experiment_args

    add_experiment_args(p)
    p.add_argument("--kinds", default="drop,corrupt",
                   help="fault kinds, comma-separated: drop, corrupt (--rates: the share of packets), "
                        "partial (--rates: the share of flows blackholed)")
    p.add_argument("--rates", default="0.005,0.01,0.02", help="fault rates, comma-separated")
    p.add_argument("--links", type=int, default=2, help="random leaf-spine links per (kind, rate, seed)")
    p.add_argument("--seeds", default="0", help="seeds, comma-separated")
    p.add_argument("--fault-at", type=int, default=15, help="iteration before which each fault goes on")
    p.add_argument("--rescore", action="store_true",
                   help="no new runs: judge the runs under --out again from their recorded counters")
    p.set_defaults(func=cmd_sweep)


def sweep_kind(text: str):
    """One --kinds entry as a fault kind a rate sweeps (one line naming the choices otherwise)."""
    from analysis.sweep import SWEEP_KINDS
    from flowpulse.errors import SpecError
    from netns_testbed.faults import FaultKind

    try:
        kind = FaultKind(text)
    except ValueError:
        kind = None
    if kind not in SWEEP_KINDS:
        raise SpecError(f"bad sweep kind {text!r}: use {', '.join(map(str, SWEEP_KINDS))} "
                        "(a kind with a rate; blackhole and delay have none)")
    return kind


def cmd_sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from analysis.sweep import SWEEP_KINDS, SweepSpec, plot, rescore, run_sweep, table as sweep_table
    from flowpulse.cmd_experiment import spec_from_args
    from flowpulse.errors import SpecError
    from netns_testbed.nsutil import require_root

    if args.rescore:
        if not (args.out / "sweep.json").exists():
            raise SpecError(f"{args.out} holds no sweep (sweep.json): run the sweep first")
        return _show(args, rescore(args.out), sweep_table, plot)
    args.fault = []
    base = spec_from_args(args)
    kinds = [sweep_kind(k.strip()) for k in args.kinds.split(",") if k.strip()]
    if not kinds:
        raise SpecError(f"bad --kinds {args.kinds!r}: name at least one of {', '.join(map(str, SWEEP_KINDS))}")
    try:
        rates = [float(x) for x in args.rates.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        raise SpecError("bad --rates or --seeds: comma-separated numbers, e.g. --rates 0.005,0.01") from None
    for r in rates:
        if not 0 < r <= 1:
            raise SpecError(f"bad sweep rate {r}: must be in (0, 1]")
    if args.fault_at >= base.job.iterations:
        raise SpecError(f"--fault-at {args.fault_at} is not before the last iteration ({base.job.iterations - 1})")
    sw = SweepSpec(base=base, kinds=kinds, rates=rates, links=args.links, seeds=seeds, fault_at=args.fault_at)
    sw.validate()
    require_root()
    bar = tqdm(total=len(sw.points()), file=sys.stderr, unit="run")

    def tick(i, n, row):
        bar.set_postfix_str(f"{row['kind']} {row['rate']:g} {row['link']}: "
                            + ("error" if "error" in row else "caught" if row["detected"] else
                               "missed (its injector hit no packet)" if row.get("fault_hit") == 0 else "missed"))
        bar.update(1)
    rows = run_sweep(sw, args.out, tick)
    bar.close()
    return _show(args, rows, sweep_table, plot)


def _show(args: argparse.Namespace, rows: list[dict], sweep_table, plot) -> int:
    tab = sweep_table(rows)
    (args.out / "table.json").write_text(json.dumps(tab, indent=1))
    png = plot(rows, args.out)
    cols = ["kind", "rate", "runs", "detection_rate", "fa_per_1000_healthy_iters", "median_iters_to_detect",
            "p95_iters_to_detect", "localization_accuracy", "localized_within_1_iter", "counters_detect",
            "counters_localize", "retrans_detect", "retrans_localize"]
    emit(args, {"table": tab, "rows": rows, "plot": str(png)}, lambda d: table(tab, cols) + f"\nplot: {png}")
    return 0
