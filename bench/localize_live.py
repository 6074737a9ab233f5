#!/usr/bin/env python3
"""Live localization in the cases a sweep does not cover: how many iterations after its first alert a
1% drop is named, on real fabrics with real gloo jobs (root).

* ``before``: the drop on ``spine2->leaf1`` is on before the agents start (4x4x2, 4 MiB allreduce,
  12 iterations): the agents never saw a healthy pulse.
* ``churn``: one set of agents over five different jobs (collectives, sizes, rank counts, placements),
  then a 4 MiB allreduce with a drop on ``leaf1->spine3`` from iteration 6 (4x4x2).
* ``8x8x1``: eight spines, a 4 MiB allreduce of 8 ranks, a drop on ``leaf5->spine6`` from iteration 10
  of 24.

Per case and run it prints when the first relevant alert came, the iterations from it to the
incident naming the link (0: named before the next iteration began; 1: within one iteration of
detection), whether a healthy link was named and the false alerts. ``--runs N`` repeats each case.

``--mitigate`` runs the agents with the closed loop's policy (agent.mitigation; ``--canary-weight``
sets the suspect uplink's share while an incident is localizing, 0.25 unless told): it also
prints the links left drained at the end (only the faulty one is right) and the drains, canaries and
restores the policy made; a false alert raised by one of its own spray changes counts as false.

    sudo .venv/bin/python bench/localize_live.py
    sudo .venv/bin/python bench/localize_live.py --cases 8x8x1 --runs 3
    sudo .venv/bin/python bench/localize_live.py --cases before churn --mitigate
    sudo .venv/bin/python bench/localize_live.py --cases churn 8x8x1 --mitigate --canary-weight 0.5

Runtime: about 3 minutes for one run of the three cases on 2 CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.daemon import AgentOptions, JsonLinesSink, SwitchAgent, make_tracker, run_agents  # noqa: E402
from agent.detector import DetectorConfig  # noqa: E402
from agent.incidents import summarize  # noqa: E402
from agent.mitigation import CANARY_WEIGHT, MitigationPolicy, Mitigator, TestbedActuator  # noqa: E402
from analysis.experiment import report_alerts  # noqa: E402
from analysis.scoring import detection_summary  # noqa: E402
from netns_testbed import builder, faults as fault_ops  # noqa: E402
from netns_testbed.builder import UpOptions  # noqa: E402
from netns_testbed.errors import SpecError  # noqa: E402
from netns_testbed.faults import parse_fault  # noqa: E402
from netns_testbed.state import Testbed  # noqa: E402
from netns_testbed.topo import FabricSpec, SprayMode  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402

CASES = ("before", "churn", "8x8x1")
PREFIX = "fpbl"


def wait_iteration(progress: Path, k: int, timeout: float = 120.0) -> None:
    """Until rank 0 reports the end of iteration ``k`` (the idle gap before ``k + 1`` begins)."""
    end = time.time() + timeout
    while time.time() < end:
        if progress.exists():
            for line in progress.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("phase") == "end" and rec.get("i") == k:
                    return
        time.sleep(0.01)
    raise TimeoutError(f"iteration {k} did not end within {timeout} s")


def run_case(case: str, out: Path, policy: MitigationPolicy | None = None) -> dict:
    shape = FabricSpec(leaves=8, spines=8, hosts_per_leaf=1) if case == "8x8x1" else \
        FabricSpec(leaves=4, spines=4, hosts_per_leaf=2)
    # the fault goes on in the idle gap after iteration ``at`` of the last job (None: before the agents start)
    link, at = {"before": ("spine2->leaf1", None), "churn": ("leaf1->spine3", 5), "8x8x1": ("leaf5->spine6", 9)}[case]
    tb = builder.up(PREFIX, shape, UpOptions(spray=SprayMode.RRDST))
    agents: list[SwitchAgent] = []
    stop = threading.Event()
    alerts_sink, inc_sink = JsonLinesSink(out / "alerts.jsonl"), JsonLinesSink(out / "incidents.jsonl")
    applied: dict[str, float] = {}
    drained_at_end: list[str] = []
    try:
        fault = parse_fault(tb.fabric, f"{link}:drop=0.01")
        if at is None:
            fault_ops.apply(tb, fault)
            applied[link] = time.time()
        agents = [SwitchAgent.on_testbed(tb, sw, AgentOptions(cfg=DetectorConfig()), sinks=[alerts_sink])
                  for sw in tb.fabric.switches]
        mitigator = Mitigator(tb.fabric, TestbedActuator(tb.prefix), policy) if policy else None
        th = threading.Thread(target=run_agents, args=(agents, stop, 0.01), daemon=True,
                              kwargs={"tracker": make_tracker(agents), "incident_sinks": [inc_sink],
                                      "mitigator": mitigator})
        th.start()
        if case == "churn":
            for k, job in enumerate([JobSpec("allreduce", 4 << 20, 10, 120), JobSpec("allgather", 2 << 20, 10, 120),
                                     JobSpec("ddp", 1 << 20, 8, 120), JobSpec("reduce_scatter", 1 << 20, 10, 120),
                                     JobSpec("allreduce", 2 << 20, 10, 120, ranks=4, placement="contiguous")]):
                res = run_job(tb, job, out / f"job{k}")
                if not res.ok:
                    raise RuntimeError(f"churn job {k} failed: {res.failure}")
        last = JobSpec("allreduce", 4 << 20, 24 if case == "8x8x1" else 12, 300)
        progress = out / "last" / "progress.jsonl"
        if at is not None:
            def operator() -> None:
                wait_iteration(progress, at)
                fault_ops.apply(tb, fault)
                applied[link] = time.time()
            threading.Thread(target=operator, daemon=True).start()
        t_job = time.time()
        job = run_job(tb, last, out / "last")
        time.sleep(0.5)
        stop.set()
        th.join(timeout=5)
        drained_at_end = sorted(Testbed.load(tb.prefix).state.drained)
    finally:
        stop.set()
        for a in agents:
            a.close()
        alerts_sink.close()
        inc_sink.close()
        builder.down(PREFIX)
    events = [json.loads(l) for l in (out / "alerts.jsonl").read_text().splitlines() if l.strip()]
    stream = [json.loads(l) for l in (out / "incidents.jsonl").read_text().splitlines() if l.strip()]
    actions = [f"{e['action']} {e['link']}" for e in stream if e.get("event") == "mitigation"]
    incs = summarize([e for e in stream if e.get("event") != "mitigation"])
    iterations = [{"index": it["index"], "start": it["start"], "end": it["end"]} for it in job.iterations]
    faults = [{"link": link, "kind": "drop", "rate": 0.01, "start": applied.get(link, t_job)}]
    det = detection_summary(faults, report_alerts(events), iterations, incs)
    f = det["per_fault"][0]
    return {"case": case, "link": link, "job_ok": job.ok, "detected": f["detected"],
            "iterations_to_detect": f.get("iterations_to_detect"), "named": f.get("localization_correct"),
            "iterations_detect_to_localize": f.get("iterations_detect_to_localize"),
            "healthy_links_named": det["incidents_naming_healthy_links"], "false_alerts": det["false_positives"],
            **({"drained_at_end": drained_at_end, "actions": actions} if policy else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: sudo .venv/bin/python bench/localize_live.py --cases before churn")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--runs", type=int, default=1, help="runs of each case (default 1)")
    ap.add_argument("--mitigate", action="store_true",
                    help="the agents drain what they name (the closed loop's default policy)")
    ap.add_argument("--canary-weight", type=float, default=CANARY_WEIGHT,
                    help=f"with --mitigate: the suspect uplink's weight while localizing (default {CANARY_WEIGHT:g})")
    args = ap.parse_args(argv)
    if args.runs < 1:
        print("localize_live: --runs takes a whole number from 1: e.g. --runs 3", file=sys.stderr)
        return 2
    try:
        policy = MitigationPolicy(canary_weight=args.canary_weight).validate() if args.mitigate else None
    except SpecError as e:
        print(f"localize_live: {e}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("localize_live: builds namespaces and loads eBPF programs: run with sudo", file=sys.stderr)
        return 3
    rows = []
    for case in args.cases:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="fp-bench-") as d:
                t0 = time.time()
                try:
                    r = run_case(case, Path(d), policy)
                except Exception as e:  # one run's failure (a build, a job) is reported, the others still run
                    traceback.print_exc()
                    r = {"case": case, "link": "-", "iterations_to_detect": None, "named": None,
                         "iterations_detect_to_localize": f"error: {type(e).__name__}", "healthy_links_named": [],
                         "false_alerts": 0, "drained_at_end": []}
                rows.append(r)
                print(f"[{time.time() - t0:4.0f}s] {case} run {i + 1}: {r}", file=sys.stderr)
    drained_col = f" {'drained at end':>16}" if args.mitigate else ""
    print(f"{'case':8} {'link':15} {'detect':>6} {'named':>5} {'iters after detection':>22} {'healthy named':>13} "
          f"{'false':>5}{drained_col}")
    for r in rows:
        drained = f" {','.join(r['drained_at_end']) or '-':>16}" if args.mitigate else ""
        print(f"{r['case']:8} {r['link']:15} {str(r['iterations_to_detect']):>6} {str(r['named']):>5} "
              f"{str(r['iterations_detect_to_localize']):>22} {len(r['healthy_links_named']):>13} "
              f"{r['false_alerts']:>5}{drained}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
