#!/usr/bin/env python3
"""The site agent's two counter sources side by side on live faults: eBPF counters against netlink
interface statistics (root).

One 4x4x2 testbed (rrdst). Per trial: eight site agents of one source (one per switch namespace,
from exported site files, no testbed state), an 8-rank gloo allreduce of --size MiB for --iterations
iterations, a drop switched on before iteration --onset; then the agents stop. Each fault is run
with both sources in turn, --reps times. Printed per source and fault: how many runs caught it, the
median faulty iteration of the first alert holding the link, the median first estimated rate, how
many runs named the link alone in an incident, and alerts that did not hold the link (false).

    sudo .venv/bin/python bench/counter_sources.py
    sudo .venv/bin/python bench/counter_sources.py --links spine1->leaf2 --rates 0.005 0.01 --reps 5

Runtime: about 40 s per trial (agents' start, the job); the default grid is 2 links x 3 rates x 2
sources x 3 reps, about 25 minutes.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.experiment import FaultScheduler  # noqa: E402
from analysis.siteagents import SiteAgents  # noqa: E402
from analysis.spec import parse_scheduled  # noqa: E402
from netns_testbed import builder, faults as fault_ops  # noqa: E402
from netns_testbed.builder import UpOptions  # noqa: E402
from netns_testbed.nsutil import require_root  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402


def trial(tb, out: Path, source: str, fault: str, link: str, args) -> dict:
    with SiteAgents(tb, out, counters=source) as agents:
        job_dir = out / "workload"
        job_dir.mkdir()
        sched = FaultScheduler(tb, [parse_scheduled(tb.fabric, f"{fault}@iter={args.onset}")],
                               job_dir / "progress.jsonl", lambda m: None)
        sched.start()
        try:
            job = run_job(tb, JobSpec("allreduce", size=args.size << 20, iterations=args.iterations, idle_ms=150),
                          job_dir)
        finally:
            sched.stop.set()
            fault_ops.clear(tb)
    if not job.ok:
        return {"error": job.failure}
    onset = next(it["end"] for it in job.iterations if it["index"] == args.onset - 1)
    ends = sorted(it["end"] for it in job.iterations if it["end"] > onset)
    raised = [a for a in agents.alerts() if a["event"] == "alert"]
    holds = [a for a in raised if a["time"] > onset and (a["link"] == link or link in a["candidates"])]
    false = [a for a in raised if a not in holds]
    first = min(holds, key=lambda a: a["time"]) if holds else None
    named = {i["link"] for i in agents.incidents() if i.get("link")}
    return {"caught": first is not None, "false": len(false), "named": named == {link},
            "iteration": sum(1 for e in ends if e < first["time"]) + 1 if first else None,
            "rate": first["estimated_rate"] if first else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--links", nargs="+", default=["spine1->leaf2", "leaf0->spine1"])
    p.add_argument("--rates", type=float, nargs="+", default=[0.005, 0.01, 0.02])
    p.add_argument("--sources", nargs="+", choices=("ebpf", "netlink"), default=["ebpf", "netlink"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--size", type=int, default=4, help="allreduce size (MiB)")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--onset", type=int, default=10, help="the fault goes on before this iteration")
    p.add_argument("--prefix", default="fpcs")
    args = p.parse_args()
    require_root()
    tb = builder.up(args.prefix, FabricSpec(), UpOptions(), progress=lambda m: None)
    rows: dict[tuple, list[dict]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="fp-sources-") as tmp:
            n = 0
            for rep in range(args.reps):
                for link in args.links:
                    for rate in args.rates:
                        for source in args.sources:   # both sources on the same fault, in turn
                            n += 1
                            out = Path(tmp) / f"t{n}"
                            out.mkdir()
                            res = trial(tb, out, source, f"{link}:drop={rate}", link, args)
                            rows.setdefault((source, link, rate), []).append(res)
                            print(f"[{n}] rep {rep + 1} {source:7} {link}:{rate:.1%} -> {res}", file=sys.stderr,
                                  flush=True)
    finally:
        builder.down(args.prefix)
    print(f"{'source':8} {'fault':22} {'caught':>7} {'median iter':>12} {'median rate':>12} {'named':>6} {'false':>6}")
    for (source, link, rate), res in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        ok = [r for r in res if "error" not in r]
        its = [r["iteration"] for r in ok if r["caught"]]
        rates = [r["rate"] for r in ok if r["caught"]]
        med_it = statistics.median(its) if its else None
        med_rate = f"{statistics.median(rates):.2%}" if rates else "-"
        print(f"{source:8} {link + ':' + format(rate, '.1%'):22} {len(its):>3}/{len(ok):<3} {str(med_it):>12} "
              f"{med_rate:>12} {sum(r['named'] for r in ok):>6} {sum(r['false'] for r in ok):>6}"
              + (f"  ({len(res) - len(ok)} job failures)" if len(ok) < len(res) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
