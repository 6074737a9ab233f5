"""``flowpulse experiment|demo|report|replay``: end-to-end runs and their analysis."""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from agent.detector.config import Model
from flowpulse.argtypes import MILLISECONDS, PER_SECOND, RATE, choice
from flowpulse.cmdbase import Formatter, add_common, emit
from flowpulse.cmd_agent import add_detector_args
from flowpulse.cmd_workload import parse_size
from netns_testbed.faults import Backend
from netns_testbed.topo import SprayMode
from workload.rank import Workload


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment", help="fabric + agents + workload + scheduled faults, end to end", formatter_class=Formatter,
        epilog="examples:\n"
               "  sudo flowpulse experiment --fault 'leaf1->spine2:drop=0.01@iter=10' --out runs/x\n"
               "  sudo flowpulse experiment --spec exp.yaml --out runs/y\n"
               "  sudo flowpulse experiment --spray rr --out-of-service 'leaf0<->spine3' \\\n"
               "       --fault 'spine0->leaf3:corrupt=0.015@t=12.5' --iterations 40 --out runs/z\n"
               "  sudo flowpulse experiment --fault-backend netem --fault 'leaf0->spine1:drop=0.02@iter=5' --out runs/n\n"
               "  sudo flowpulse experiment --mitigate --fault 'leaf2->spine1:drop=0.02@iter=10' --out runs/m\n"
               "FAULT is LINK:KIND[=RATE][,MODS][@iter=K|@t=SECONDS] (see `flowpulse fault add --help`).")
    add_experiment_args(p)
    p.set_defaults(func=cmd_experiment)

    d = sub.add_parser("demo", help="the main job: catch a silent 1%% drop on a random link", formatter_class=Formatter,
                       epilog="Builds the default fabric, runs an 8-rank gloo allreduce, switches on 1%% drop on a\n"
                              "random leaf-spine link part-way through and tells what the agents saw; they drain the\n"
                              "link they name, and the demo prints what the fault cost and how the job recovered.\n"
                              "Exit 0 only if the fault was caught and localized (and, with the loop on, only the\n"
                              "faulty link is left drained).\n"
                              "examples:\n  sudo flowpulse demo\n  sudo flowpulse demo --seed 3 --rate 0.02\n"
                              "  sudo flowpulse demo --no-mitigate     # detect and name only")
    d.add_argument("--out", type=Path, default=None, help="run directory (default runs/demo-<time>)")
    d.add_argument("--force", action="store_true", help="replace the run files of a previous run in --out")
    d.add_argument("--seed", type=int, default=None, help="choose the faulty link with this seed")
    d.add_argument("--rate", type=RATE, default=0.01, help="drop rate of the injected fault")
    d.add_argument("--iterations", type=int, default=40)
    d.add_argument("--fault-at", type=int, default=15, help="iteration before which the fault goes on")
    d.add_argument("--no-mitigate", action="store_true", help="leave the named link in service (no drain)")
    add_common(d)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("report", help="tables and PNG plots of a run directory", formatter_class=Formatter,
                       epilog="examples:\n  flowpulse report runs/x\n  flowpulse report runs/x --json\n"
                              "  flowpulse report tests/data/recorded-runs/busy-ddp-two-faults\n")
    r.add_argument("run", type=Path)
    add_common(r, prefix=False)
    r.set_defaults(func=cmd_report)

    rp = sub.add_parser("replay", help="run the detector offline on a run's recorded counters", formatter_class=Formatter,
                        epilog="examples:\n  flowpulse replay runs/x --fa-per-day 0.01\n"
                               "  flowpulse replay runs/x --as-feed | flowpulse feed -\n"
                               "  flowpulse replay tests/data/pulse-traces/f1_rrdst --model learned\n")
    rp.add_argument("run", type=Path, help="a run directory, or a recorded pulse-trace directory (pulses.csv or pulses.csv.gz)")
    rp.add_argument("--as-feed", action="store_true",
                    help="print the run's pulses as a feed (flowpulse feed's input) instead of judging them")
    add_detector_args(rp)
    add_common(rp, prefix=False)
    rp.set_defaults(func=cmd_replay)


def add_experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", type=Path, help="YAML spec; flags given explicitly override it")
    p.add_argument("--leaves", type=int)
    p.add_argument("--spines", type=int)
    p.add_argument("--hosts-per-leaf", type=int)
    p.add_argument("--spray", type=choice(SprayMode), choices=list(SprayMode))
    p.add_argument("--workload", type=choice(Workload), choices=list(Workload))
    p.add_argument("--size", type=parse_size)
    p.add_argument("--iterations", type=int)
    p.add_argument("--idle-ms", type=MILLISECONDS)
    p.add_argument("--ranks", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--out-of-service", action="append", default=None, metavar="LINK")
    p.add_argument("--fault", action="append", default=None, metavar="FAULT")
    p.add_argument("--fault-backend", type=choice(Backend), choices=list(Backend), default=None,
                   help="what injects the faults: the datapath's BPF injector (default) or the kernel's netem")
    p.add_argument("--mitigate", action="store_true",
                   help="the agents drain the link an incident names (a canary share on the suspect uplink while "
                        "it is localizing: agent/mitigation.py); default: they only report")
    p.add_argument("--model", type=choice(Model), choices=list(Model))
    p.add_argument("--fa-per-day", type=PER_SECOND, help="false-alert budget of the fabric per day (default 1)")
    p.add_argument("--pulse-hz", type=PER_SECOND, help="pulses per second per switch, for the budget (default 1)")
    p.add_argument("--out", type=Path, required=True, help="run directory (new or empty)")
    p.add_argument("--force", action="store_true", help="replace the run files of a previous run in --out")
    p.add_argument("--no-plots", action="store_true")
    add_common(p)


def spec_from_args(args: argparse.Namespace):
    from analysis.spec import from_dict, load_yaml

    data = load_yaml(args.spec) if getattr(args, "spec", None) else {}
    fabric = dict(data.get("fabric") or {})
    for k in ("leaves", "spines", "hosts_per_leaf"):
        if getattr(args, k, None) is not None:
            fabric[k] = getattr(args, k)
    data["fabric"] = fabric
    w = dict(data.get("workload") or {})
    for flag, key in (("workload", "kind"), ("size", "size"), ("iterations", "iterations"), ("idle_ms", "idle_ms"),
                      ("ranks", "ranks")):
        if getattr(args, flag, None) is not None:
            w[key] = getattr(args, flag)
    data["workload"] = w
    for flag in ("spray", "seed", "fault_backend"):
        if getattr(args, flag, None) is not None:
            data[flag] = getattr(args, flag)
    if args.out_of_service is not None:
        data["out_of_service"] = args.out_of_service
    if args.fault is not None:
        data["faults"] = args.fault
    if getattr(args, "mitigate", False) and data.get("mitigation") is None:
        data["mitigation"] = {}
    det = dict(data.get("detector") or {})
    for flag in ("model", "fa_per_day", "pulse_hz"):
        if getattr(args, flag, None) is not None:
            det[flag] = getattr(args, flag)
    data["detector"] = det
    return from_dict(data, prefix=args.prefix).validate()


def _run(spec, out: Path, args) -> dict:
    from analysis.experiment import run_experiment
    from analysis.report import make_plots
    from netns_testbed.nsutil import require_root

    from analysis.rundir import claim
    from netns_testbed.faults import Backend, require_netem

    require_root()
    if spec.fault_backend is Backend.NETEM:
        require_netem()                     # before the run directory is claimed or anything built
    claim(out, getattr(args, "force", False))
    t0 = time.time()
    rep = run_experiment(spec, out, progress=lambda m: print(f"[{time.time() - t0:6.1f}s] {m}", file=sys.stderr))
    if not getattr(args, "no_plots", False):
        make_plots(out)
    return rep


def cmd_experiment(args: argparse.Namespace) -> int:
    from analysis.report import text_summary

    from analysis.rundir import check_out

    spec = spec_from_args(args)
    check_out(args.out, args.force)
    rep = _run(spec, args.out, args)
    emit(args, rep, lambda r: text_summary(r) + f"\nrun directory: {args.out}")
    return 0 if rep["workload"].get("ok") and not rep.get("agents_failed") else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from analysis.report import text_summary
    from agent.mitigation import MitigationPolicy
    from analysis.spec import ExperimentSpec, parse_scheduled
    from netns_testbed.topo import Fabric, FabricSpec
    from workload.launcher import JobSpec

    rng = random.Random(args.seed)
    fabric = Fabric(FabricSpec())
    link = rng.choice(fabric.fabric_links()).name
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    fault = f"{link}:drop={args.rate:g}@iter={args.fault_at}"
    spec = ExperimentSpec(fabric=fabric.spec, job=JobSpec(size=4 << 20, iterations=args.iterations, idle_ms=300),
                          faults=[parse_scheduled(fabric, fault)], prefix=args.prefix,
                          mitigation=None if args.no_mitigate else MitigationPolicy()).validate()
    say = (lambda m: print(m, file=sys.stderr))
    say(f"FlowPulse demo: 4 leaves x 4 spines x 2 hosts, 8-rank gloo allreduce of 4 MiB, {args.iterations} iterations;\n"
        f"a silent {args.rate:.1%} drop goes on {link} before iteration {args.fault_at}. Nobody is told where.")
    rep = _run(spec, out, args)
    det = rep["detection"]["per_fault"][0]
    caught = det["detected"]
    localized = det.get("localization_correct", False)
    left = rep["mitigation"]["drained_at_end"]
    loop_ok = args.no_mitigate or left == [link]

    def story(r: dict) -> str:
        lines = ["", text_summary(r), ""]
        lines.append(f"plots: {out}/fabric.png, {out}/ports-{r['alerts'][0]['switch'] if r['alerts'] else '...'}.png")
        verdict = "caught and localized" if caught and localized else \
            "caught, localized to candidates only" if caught else "NOT caught"
        if not args.no_mitigate:
            verdict += f"; drained at the end: {', '.join(left) or 'nothing'}" + ("" if loop_ok else " (WRONG)")
        lines.append("RESULT: " + verdict)
        return "\n".join(lines)
    emit(args, rep, story)
    return 0 if caught and localized and loop_ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import load_report, make_plots, text_summary

    rep = load_report(args.run)
    plots = make_plots(args.run)
    emit(args, {"detection": rep["detection"], "plots": [str(p) for p in plots]},
         lambda _: text_summary(rep) + "\nplots: " + ", ".join(str(p) for p in plots))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from analysis.replay import replay_dir
    from analysis.report import detection_lines
    from flowpulse.cmd_agent import detector_config

    if args.as_feed:
        from analysis.replay import run_as_feed

        for line in run_as_feed(args.run):
            print(line)
        return 0
    res = replay_dir(args.run, detector_config(args), degraded=args.degraded)
    emit(args, res, lambda r: "\n".join(
        [f"replayed {r['pulses']} switch-pulses from {args.run} (spray {r['spray']}, model {args.model})"]
        + [f"  {a['event']:8} {a['switch']} port {a['port']} ({a['ifname']}) {a['kind']} ~{a['estimated_rate']:.2%} "
           f"score={a['score']:.1f} window={a['window']} link={a['link'] or ' / '.join(a['candidates'])}"
           + (f" (iteration {a['iteration']})" if a.get("iteration") is not None else "")
           for a in r["events"] if a["event"] != "update"]
        + (detection_lines(r["detection"]) if r.get("detection") else [])))
    return 0
