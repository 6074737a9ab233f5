#!/usr/bin/env python3
"""One fault, one page, over a sweep (root): every fault reaches the on-call receiver as one firing
notification and one resolve, and the routing receiver as one drain and one resolve, whatever number of
switches saw it.

One 4x4x2 testbed and one set of agents for the whole sweep, as ``flowpulse agent --all --mitigate``
runs them (one metrics endpoint, one incident tracker, the closed loop's default policy), scraped by a
real Prometheus that evaluates the shipped rules and sends to a real Alertmanager with the shipped
routes (analysis/alertstack.py: scrape and evaluate every second; Alertmanager's ``group_wait`` and
``group_interval`` shortened to --group-wait and --group-interval, which gives a fault more chances to
page twice, not fewer). Every receiver posts to one webhook on loopback.

Per fault (--faults N, drawn with --seed: a leaf-spine link in either direction, and a 1% or 2% drop
or a 1% corruption): a gloo allreduce of 2 MiB, 30 iterations, the fault on before iteration 8. Then
the operator acts on the page: once the on-call page and the drain action have come and 5 s passed
without another notification (at most --quiet + 10 s), the link is repaired (the fault cleared) and
what was drained restored (``flowpulse fabric restore``). A healthy job of 25 iterations runs on the
repaired link, whose alerts clear; the bench waits until both resolves came and the receiver has been
quiet for --quiet seconds (longer than a localizing incident waits to page: the rules' 30 s), at most
--settle seconds, before the next fault.

Per fault it prints the link and kind, the link the incident named, the links drained before the
repair, the incident's cost as Prometheus had it when the operator acted (``flowpulse_incident_*``:
seconds from the onset to detect, name and drain; the pulse period before, during and after the
drain), and the notifications: on-call firing / resolved, routing firing / resolved. Right is 1 / 1 /
1 / 1 with the faulty link named, paged and drained and nothing else, no link left drained and no
incident left open. A last line sums the sweep.

    sudo .venv/bin/python bench/paging.py
    sudo .venv/bin/python bench/paging.py --faults 12 --seed 3 --json

Runtime: about 90 seconds per fault on 2 CPUs.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.daemon import AgentOptions, SwitchAgent, make_tracker, run_agents  # noqa: E402
from agent.detector import DetectorConfig  # noqa: E402
from agent.metrics import serve  # noqa: E402
from agent.mitigation import Mitigator, TestbedActuator  # noqa: E402
from analysis.alertstack import AlertStack, Webhook  # noqa: E402
from analysis.experiment import FaultScheduler  # noqa: E402
from analysis.spec import parse_scheduled  # noqa: E402
from flowpulse.cli import Terminated, unwinding_signals  # noqa: E402
from netns_testbed import builder, drain, faults as fault_ops  # noqa: E402
from netns_testbed.builder import UpOptions  # noqa: E402
from netns_testbed.state import Testbed  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402

PREFIX = "fppg"
KINDS = ("drop=0.01", "drop=0.02", "corrupt=0.01")
FAULT_AT, FAULTY_ITERATIONS, HEALTHY_ITERATIONS = 8, 30, 25


def count(notes: list[dict], receiver: str, status: str) -> int:
    return sum(1 for n in notes if n["receiver"] == receiver and n["status"] == status)


def wait_for(hook: Webhook, since: float, done, quiet: float, settle: float) -> None:
    """Until ``done(notifications)`` and ``quiet`` seconds without one (or nothing at all for ``quiet``
    seconds), at most ``settle`` seconds."""
    start = time.time()
    while time.time() - start < settle:
        notes = hook.since(since)
        last = max(hook.last_time() or 0.0, start)
        if (done(notes) or not notes) and time.time() - last >= quiet:
            return
        time.sleep(0.5)


def scraped_cost(stack: AlertStack, link: str) -> dict:
    """The incident's cost as Prometheus has it (agent/faultcost.py): seconds from the onset to detect,
    name and drain; the pulse period per phase at the switch that first alerted."""
    out: dict = {}
    for name, key in (("flowpulse_incident_seconds", "to"), ("flowpulse_incident_pulse_period_seconds", "phase"),
                      ("flowpulse_incident_resent_segments", "phase")):
        for r in stack.query(f'{name}{{incident="{link}"}}'):
            out.setdefault(name.removeprefix("flowpulse_incident_"), {})[r["metric"][key]] = round(float(r["value"][1]), 3)
    return out


def one_fault(tb: Testbed, hook: Webhook, stack: AlertStack, mitigator: Mitigator, tracker, link: str, fault: str,
              out: Path, quiet: float, settle: float) -> dict:
    """The faulty job; the operator's wait for the page and the drain; the repair and restore; a
    healthy job on the repaired link; the wait for the resolves."""
    t0 = time.time()
    history_from = len(tracker.history)
    state: dict = {}
    sched = FaultScheduler(tb, [parse_scheduled(tb.fabric, f"{link}:{fault}@iter={FAULT_AT}")],
                           out / "faulty" / "progress.jsonl", lambda m: None)
    sched.start()
    try:
        first = run_job(tb, JobSpec(size=2 << 20, iterations=FAULTY_ITERATIONS, idle_ms=150), out / "faulty")
    finally:
        sched.stop.set()
        sched.join(timeout=10)
    if sched.errors:
        raise RuntimeError(f"the fault did not go on: {sched.errors[0]}")
    state["fault_on"] = sched.applied.get(link)
    drained_at_job_end = sorted(mitigator.drained())
    # the operator acts on the page: the on-call notification and the routing receiver's drain (a
    # localizing incident pages only after 30 s); whatever came, then quiet
    wait_for(hook, t0, lambda n: count(n, "oncall", "firing") and count(n, "routing", "firing"), 5.0, quiet + 10)
    state["drained"] = sorted(Testbed.load(tb.prefix).state.drained)
    state["cost"] = scraped_cost(stack, link)
    fault_ops.clear(tb, link)
    if state["drained"]:
        drain.restore(tb, tb.fabric.links_named(state["drained"]))
    t_repair = time.time()
    second = run_job(tb, JobSpec(size=2 << 20, iterations=HEALTHY_ITERATIONS, idle_ms=150), out / "repaired")
    wait_for(hook, t0, lambda n: count(n, "oncall", "resolved") and count(n, "routing", "resolved"), quiet, settle)
    notes = hook.since(t0)
    incs = tracker.history[history_from:]
    named = sorted({e["link"] for e in incs if e.get("link") and e["event"] in ("open", "localized", "update")})
    paged = sorted({a["labels"].get("link", "") for n in notes if n["receiver"] == "oncall" and n["status"] == "firing"
                    for a in n["alerts"]})
    drains = [a["labels"].get("link", "") for n in notes if n["receiver"] == "routing" and n["status"] == "firing"
              for a in n["alerts"]]
    acts = [e for e in mitigator.history if e["time"] >= t0]
    first_drain = next((e["time"] for e in acts if e["action"] == "drain"), None)
    resolved_at = [e["time"] for e in incs if e["event"] == "resolved"]
    row = {"link": link, "fault": fault, "jobs_ok": first.ok and second.ok, "named": named,
           "drained_at_job_end": drained_at_job_end, "drained": state["drained"], "paged_links": paged,
           "drain_actions": drains,
           "oncall_firing": count(notes, "oncall", "firing"), "oncall_resolved": count(notes, "oncall", "resolved"),
           "routing_firing": count(notes, "routing", "firing"), "routing_resolved": count(notes, "routing", "resolved"),
           "to_drain_s": round(first_drain - state["fault_on"], 1) if first_drain and state.get("fault_on") else None,
           "repair_to_resolved_s": round(max(resolved_at) - t_repair, 1) if resolved_at and
           max(resolved_at) > t_repair else None,
           "left_drained": sorted(Testbed.load(tb.prefix).state.drained),
           "incidents": sorted({e["incident_id"] for e in incs}),
           "cost": state["cost"],
           "open_after": sorted(i.incident_id for i in tracker.open()),
           # what each notification held: when (seconds after the faulty job began), receiver, status, and
           # per alert its name, status and the labels that tell incidents apart
           "notifications": [{"t": round(at - t0, 1), "receiver": n["receiver"], "status": n["status"],
                              "alerts": [{"name": a["labels"].get("alertname"), "status": a.get("status"),
                                          **{k: a["labels"][k] for k in ("incident", "state", "link", "candidates")
                                             if k in a["labels"]}} for a in n["alerts"]]}
                             for n, at in hook.since_with_times(t0)],
           "incident_events": [{"t": round(e["time"] - t0, 1), "event": e["event"], "id": e["incident_id"],
                                "state": e.get("state"), "candidates": e.get("candidates")} for e in incs]}
    row["right"] = (row["named"] == [link] and row["drained"] == [link] and row["paged_links"] == [link]
                    and row["drain_actions"] == [link]
                    and [row[k] for k in ("oncall_firing", "oncall_resolved", "routing_firing", "routing_resolved")]
                    == [1, 1, 1, 1] and not row["left_drained"] and not row["open_after"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=6, help="faults in the sweep (default 6)")
    ap.add_argument("--seed", type=int, default=1, help="draws the links and kinds")
    ap.add_argument("--group-wait", default="1s", help="Alertmanager's group_wait (shipped: 10s)")
    ap.add_argument("--group-interval", default="5s", help="Alertmanager's group_interval (shipped: 1m)")
    ap.add_argument("--quiet", type=float, default=40.0, help="seconds without a notification that end a fault")
    ap.add_argument("--settle", type=float, default=150.0, help="the most seconds to wait after a job")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.faults < 1:
        ap.error("--faults: at least 1")
    if args.quiet < 31:
        ap.error("--quiet: at least 31 s (a localizing incident pages after 30 s)")
    fab = Fabric(FabricSpec())
    rng = random.Random(args.seed)
    plan = [(rng.choice(fab.fabric_links()).name, rng.choice(KINDS)) for _ in range(args.faults)]
    rows = []
    stop = threading.Event()
    agents: list[SwitchAgent] = []
    hook = Webhook()
    stack = None
    builder.down(PREFIX)                 # what a killed run left
    tb = builder.up(PREFIX, FabricSpec(), UpOptions())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            agents = [SwitchAgent.on_testbed(tb, sw, AgentOptions(cfg=DetectorConfig(), persist=False))
                      for sw in tb.fabric.switches]
            tracker = make_tracker(agents)
            mitigator = Mitigator(tb.fabric, TestbedActuator(tb.prefix))
            base = 19700 + random.Random(time.time()).randrange(0, 80) * 2
            serve(agents, base + 10, tracker=tracker, mitigator=mitigator)
            stack = AlertStack(Path(tmp), [base + 10], base, hook, group_wait=args.group_wait,
                               group_interval=args.group_interval)
            th = threading.Thread(target=run_agents, args=(agents, stop, 0.01), daemon=True,
                                  kwargs={"tracker": tracker, "mitigator": mitigator})
            th.start()
            for k, (link, fault) in enumerate(plan):
                print(f"[{k + 1}/{len(plan)}] {fault} on {link}", file=sys.stderr, flush=True)
                rows.append(one_fault(tb, hook, stack, mitigator, tracker, link, fault, Path(tmp) / f"job{k}",
                                      args.quiet, args.settle))
                print(f"    named {rows[-1]['named']} paged {rows[-1]['oncall_firing']}/{rows[-1]['oncall_resolved']} "
                      f"drain {rows[-1]['routing_firing']}/{rows[-1]['routing_resolved']}", file=sys.stderr, flush=True)
            stop.set()
            th.join(timeout=5)
    finally:
        stop.set()
        if stack:
            stack.close()
        hook.close()
        for a in agents:
            a.close()
        builder.down(PREFIX)
    summary = {"faults": len(rows), "right": sum(r["right"] for r in rows),
               "one_page": sum(r["oncall_firing"] == 1 for r in rows),
               "one_resolve": sum(r["oncall_resolved"] == 1 for r in rows),
               "one_drain": sum(r["routing_firing"] == 1 for r in rows),
               "healthy_left_drained": sum(bool(set(r["left_drained"]) - {r["link"]}) for r in rows),
               "healthy_drained": sum(bool(set(r["drained"]) - {r["link"]}) for r in rows),
               "jobs_ok": all(r["jobs_ok"] for r in rows)}
    if args.json:
        print(json.dumps({"group_wait": args.group_wait, "group_interval": args.group_interval, "rows": rows,
                          "summary": summary}, indent=2))
        return 0
    print(f"group_wait {args.group_wait}, group_interval {args.group_interval}; notifications per fault: "
          f"on-call firing/resolved, routing firing/resolved")
    print(f"{'fault':30s} {'named':18s} {'drained':18s} {'on-call':>7s} {'routing':>7s} {'to drain s':>10s} "
          f"{'repair to resolved s':>20s}  right  period before/during/after drain s (Prometheus)")
    for r in rows:
        print(f"{r['fault'] + ' on ' + r['link']:30s} {','.join(r['named']) or '-':18s} "
              f"{','.join(r['drained']) or '-':18s} {r['oncall_firing']:>5d}/{r['oncall_resolved']:<1d} "
              f"{r['routing_firing']:>5d}/{r['routing_resolved']:<1d} {r['to_drain_s']!s:>10s} "
              f"{r['repair_to_resolved_s']!s:>20s}  {r['right']!s:5s}  "
              + "/".join(str(r["cost"].get("pulse_period_seconds", {}).get(ph, "-"))
                         for ph in ("before", "during", "after_drain")))
    s = summary
    print(f"{s['right']} of {s['faults']} right; one page {s['one_page']}, one resolve {s['one_resolve']}, one drain "
          f"{s['one_drain']}; healthy links drained {s['healthy_drained']}, left drained {s['healthy_left_drained']}; "
          f"jobs {'all completed' if s['jobs_ok'] else 'NOT all completed'}")
    return 0


if __name__ == "__main__":
    try:
        with unwinding_signals():        # SIGTERM: the testbed, Prometheus and Alertmanager go too
            sys.exit(main())
    except Terminated as stopped:
        sys.exit(128 + stopped.signum)
