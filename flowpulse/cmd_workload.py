"""``flowpulse workload run``: a real torch.distributed (gloo) job across the host namespaces."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from flowpulse.argtypes import MILLISECONDS, SECONDS, choice
from flowpulse.cmdbase import Formatter, add_common, emit
from workload.launcher import Placement
from workload.rank import Workload


def parse_size(text: str) -> int:
    """argparse's view of :func:`workload.launcher.parse_size`."""
    from netns_testbed.errors import SpecError
    from workload.launcher import parse_size as parse

    try:
        return parse(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", type=choice(Workload), choices=list(Workload), default=Workload.ALLREDUCE, help="collective, or ddp (a real training job)")
    p.add_argument("--size", type=parse_size, default=4 << 20, help="bytes per collective / gradient (e.g. 4MiB)")
    p.add_argument("--iterations", type=int, default=20, help="iterations (one traffic pulse each)")
    p.add_argument("--idle-ms", type=MILLISECONDS, default=300.0, help="idle/compute phase between iterations")
    p.add_argument("--ranks", type=int, default=None, help="ranks (default: one per host)")
    p.add_argument("--placement", type=choice(Placement), choices=list(Placement), default=Placement.INTERLEAVED,
                   help="interleaved: rank r on leaf r %% L (every leaf-spine link used)")
    p.add_argument("--gloo-timeout", type=SECONDS, default=30.0, help="gloo timeout, seconds")
    p.add_argument("--deadline", type=SECONDS, default=None, help="wall-clock limit for the whole job, seconds")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="run real torch.distributed jobs on the testbed", formatter_class=Formatter)
    wsub = p.add_subparsers(dest="workload_cmd", metavar="ACTION", required=True)
    run = wsub.add_parser("run", help="one rank per host namespace, gloo backend", formatter_class=Formatter,
                          epilog="examples:\n  sudo flowpulse workload run --size 4MiB --iterations 20\n"
                                 "  sudo flowpulse workload run --workload ddp --iterations 30 --out runs/ddp-job\n")
    add_job_args(run)
    run.add_argument("--out", type=Path, default=None, help="directory for rank logs and workload.json")
    add_common(run)
    run.set_defaults(func=cmd_run)


def job_spec(args: argparse.Namespace):
    from workload.launcher import JobSpec

    return JobSpec(workload=args.workload, size=args.size, iterations=args.iterations, idle_ms=args.idle_ms,
                   ranks=args.ranks, placement=args.placement, gloo_timeout_s=args.gloo_timeout,
                   deadline_s=args.deadline)


def cmd_run(args: argparse.Namespace) -> int:
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed
    from workload.launcher import run_job

    require_root()
    tb = Testbed.load(args.prefix)
    out = args.out or Path(tempfile.mkdtemp(prefix="flowpulse-job-"))
    res = run_job(tb, job_spec(args), out, progress=lambda m: print(f"[workload] {m}", file=sys.stderr))
    s = res.summary

    def human(_):
        lines = [f"{'ok' if res.ok else 'FAILED'}: {s.get('completed_iterations', 0)} iterations in {res.wall_s:.1f} s"
                 f" (results in {out})"]
        if s.get("iteration_s_median"):
            lines.append(f"iteration median {s['iteration_s_median'] * 1e3:.1f} ms, p95 {s['iteration_s_p95'] * 1e3:.1f} ms,"
                         f" bus bandwidth {s['busbw_gbps']:.3f} Gbit/s")
        if res.failure:
            lines.append(f"rank {res.failed_rank} ({res.hosts[res.failed_rank]}) failed: {res.failure}")
        return "\n".join(lines)
    emit(args, {**res.to_dict(), "out": str(out)}, human)
    return 0 if res.ok else 1
