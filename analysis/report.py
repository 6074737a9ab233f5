"""Tables and PNG plots of a run directory (matplotlib, no display needed)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.rundir import load_pulses, load_report  # noqa: E402
from netns_testbed.topo import Fabric, FabricSpec  # noqa: E402


def focus_switch(report: dict) -> str:
    """The switch worth plotting: the first alert's, else the faulty link's downstream switch."""
    if report["alerts"]:
        return report["alerts"][0]["switch"]
    if report["faults"]:
        dst = report["faults"][0]["link"].split("->")[1]
        return dst if not dst.startswith("h") else report["faults"][0]["link"].split("->")[0]
    return report["fabric"]["leaves"][0]


def plot_ports(run: Path, report: dict, switch: str) -> Path:
    pulses = [p for p in load_pulses(Path(run) / "pulses").get(switch, []) if p.total > 200]
    fabric = Fabric(FabricSpec.from_dict(report["spec"]["fabric"]))
    t0 = report["started"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    xs = [p.end_time - t0 for p in pulses]
    leaf = switch.startswith("leaf")
    uplinks = fabric.uplinks(switch) if leaf else []
    for port in fabric.ports[switch]:
        if leaf and port.index < len(uplinks):
            # deficit against the mean of the uplinks: what the peer test sees
            ys = [float(p.ip[:len(uplinks), 0].sum(axis=1).mean() - p.ip[port.index, 0].sum()) for p in pulses]
        elif leaf:
            continue
        else:
            ys = [float(p.ip[port.index, 0].sum()) for p in pulses]
        axes[0].plot(xs, ys, marker=".", lw=1, label=f"port {port.index} ({port.ifname}) in")
        sc = [float(p.meta.get("scores", {}).get(str(port.index), 0.0)) for p in pulses]
        if any(sc):
            axes[1].plot(xs, sc, marker=".", lw=1, label=f"port {port.index} ({port.ifname})")
    axes[1].axhline(1.0, color="k", ls=":", label="alert threshold (score 1)")
    for f in report["faults"]:
        if f.get("start"):
            for ax in axes:
                ax.axvline(f["start"] - t0, color="r", ls="--")
            axes[0].annotate(f"fault on: {f['spec']}", (f["start"] - t0, axes[0].get_ylim()[1]), color="r",
                             fontsize=8, va="top")
    for a in report["alerts"]:
        if a["switch"] == switch:
            axes[1].axvline(a["time"] - t0, color="orange", lw=2, alpha=0.6)
    axes[0].set_ylabel("uplink deficit vs peer mean (packets)" if leaf else "IPv4 packets per pulse")
    axes[0].set_title(f"{switch}: per-pulse ingress {'deficit of each uplink' if leaf else 'packets per port'}"
                      " (one pulse = one iteration)")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_ylabel("score (CUSUM / threshold)")
    axes[1].set_xlabel("seconds since start")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(run) / f"ports-{switch}.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_fabric(run: Path, report: dict) -> Path:
    fabric = Fabric(FabricSpec.from_dict(report["spec"]["fabric"]))
    L, S = fabric.spec.leaves, fabric.spec.spines
    pos = {}
    for i, s in enumerate(fabric.spines):
        pos[s] = ((i + 0.5) * L / S, 2.0)
    for i, l in enumerate(fabric.leaves):
        pos[l] = (i + 0.5, 1.0)
    hp = fabric.spec.hosts_per_leaf
    for i, h in enumerate(fabric.hosts):
        pos[h] = ((i // hp) + (i % hp + 0.5) / hp, 0.2)
    fault_links = {f["link"] for f in report["faults"]}
    flagged = {i["link"] for i in report.get("incidents", []) if i.get("link")}
    suspects = {c for a in report["alerts"] for c in a["candidates"]} - flagged
    fig, ax = plt.subplots(figsize=(max(6, L * 1.6), 4.5))
    for link in fabric.links():
        if link.src > link.dst and not link.src.startswith("h"):
            continue  # draw each cable once; colour by either direction
        names = {link.name, link.reverse.name}
        color, lw = "0.75", 1
        if names & suspects:
            color, lw = "orange", 2.5
        if names & flagged:
            color, lw = "red", 3.5
        (x1, y1), (x2, y2) = pos[link.src], pos[link.dst]
        ax.plot([x1, x2], [y1, y2], color=color, lw=lw, zorder=1, ls="--" if names & fault_links and not names & flagged else "-")
    for n, (x, y) in pos.items():
        ax.scatter([x], [y], s=500 if not n.startswith("h") else 150, zorder=2,
                   color="#4878cf" if n.startswith("spine") else "#6acc65" if n.startswith("leaf") else "0.6")
        ax.annotate(n, (x, y), ha="center", va="center", fontsize=7, zorder=3)
    ax.set_axis_off()
    truth = ", ".join(sorted(fault_links)) or "none"
    named = ", ".join(sorted(flagged)) or "none"
    ax.set_title(f"injected: {truth}   |   FlowPulse localized: {named}\n(red: localized link, orange: other candidates, dashed: injected)",
                 fontsize=9)
    out = Path(run) / "fabric.png"
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_cost(run: Path, report: dict) -> Path | None:
    """What each fault cost the job: every iteration's time (rank 0) against when it began, each fault's
    start, first alert, name and drain marked, and the medians report.json's cost holds (before the
    fault, while it acted, from the second iteration after the drain) drawn over their spans. None when
    the run had no fault."""
    costs = {c["link"]: c for c in report.get("cost") or []}
    faults = [f for f in report["faults"] if f.get("start") and f["link"] in costs]
    its = sorted(report.get("iterations") or [], key=lambda it: it["index"])
    if not faults or not its:
        return None
    t0 = report["started"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot([it["start"] - t0 for it in its], [it["duration_s"] * 1000 for it in its], marker=".", lw=1, color="0.3",
            label="iteration time (rank 0)")
    marks = (("to_detect_s", "detected", "orange"), ("to_name_s", "named", "purple"), ("to_drain_s", "drained", "green"))
    for f in faults:
        c, start = costs[f["link"]], f["start"] - t0
        ax.axvline(start, color="r", ls="--", label=f"fault on: {f['spec']}")
        for key, what, color in marks:
            if c.get(key) is not None:
                ax.axvline(start + c[key], color=color, ls=":", label=f"{what} +{c[key]:.1f} s")
        end = its[-1]["end"] - t0
        drained = start + c["to_drain_s"] if c.get("to_drain_s") is not None else None
        spans = [("before_ms", its[0]["start"] - t0, start), ("during_ms", start, drained if drained else end),
                 ("after_drain_ms", drained, end)]
        for key, a, b in spans:
            if c.get(key) is not None and a is not None:
                ax.hlines(c[key], a, b, color="b", lw=2, alpha=0.5)
                ax.annotate(f"{c[key]:.0f} ms", (a, c[key]), color="b", fontsize=8, va="bottom")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("what the fault cost the job (blue: medians before, while it acted, after the drain)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(run) / "cost.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def make_plots(run: Path) -> list[Path]:
    report = load_report(run)
    sw = focus_switch(report)
    cost = plot_cost(run, report)
    return [plot_ports(run, report, sw), plot_fabric(run, report)] + ([cost] if cost else [])


def text_summary(report: dict) -> str:
    det = report["detection"]
    lines = []
    w = report["workload"]
    lines.append(f"workload: {'completed' if w.get('ok') else 'FAILED: ' + str(w.get('failure'))}, "
                 f"{w.get('completed_iterations', 0)} iterations, median {1e3 * (w.get('iteration_s_median') or 0):.0f} ms")
    for f in report["faults"]:
        hit = "" if f.get("hit") is None else f", {f['hit']} of {f['matched']} packets hit"
        lines.append(f"fault: {f['spec']} (on at {f['start'] - report['started']:.1f} s{hit})" if f.get("start")
                     else f"fault: {f['spec']} (never switched on)")
    for a in report["alerts"]:
        lines.append(f"alert: {a['switch']} port {a['port']} ({a['ifname']}) {a['kind']} "
                     f"~{a['estimated_rate']:.2%} score={a['score']:.1f} at {a['time'] - report['started']:.1f} s; "
                     f"link {a['link'] or 'one of ' + ' / '.join(a['candidates'])}")
    for i in report.get("incidents", []):
        lines.append(f"incident: {i['kind']} on {i['link'] or '?'} ({i['how']})")
    lines += detection_lines(det)
    for act in (report.get("mitigation") or {}).get("actions", []):
        lines.append(f"mitigation: {act['action']} {act['link']} at {act['time'] - report['started']:.1f} s "
                     f"({act['reason']})")
    lines += cost_lines(report)
    if report.get("agents_failed"):
        lines.append(f"AGENTS FAILED: the poll loop stopped before the run's end ({report['agents_failed']}); "
                     f"alerts after it are missing (the traceback is in the log)")
    for sw, n in sorted((report.get("agent_errors") or {}).items()):
        lines.append(f"agent errors: {sw}: {n} poll(s) raised (tracebacks in the log)")
    b = report.get("baselines", {})
    if b:
        ic, hr = b["interface_counters"], b["host_retransmissions"]
        lines.append(f"baseline interface counters: flagged links {ic['flagged_links'] or 'none'}, "
                     f"switches with header errors {ic['flagged_switches'] or 'none'}")
        lines.append(f"baseline host retransmissions: {'alarm on ' + ', '.join(hr.get('alarmed_hosts', [])) if hr['detected'] else 'no alarm'}"
                     f"; blame: {hr.get('guess') or ('tie among ' + str(len(hr.get('tied_top_links', []))) + ' links' if hr.get('tied_top_links') else 'none')}")
    return "\n".join(lines)


def detection_lines(det: dict) -> list[str]:
    """The report's (or a replay's) detection: faults caught, false alerts, and per fault when it was
    caught and named."""
    lines = [f"detection: {det['true_positives']}/{det['faults']} faults caught, {det['false_positives']} false "
             f"alerts, {det['localization_correct']} localized right"]
    for pf in det["per_fault"]:
        if pf["detected"]:
            lines.append(f"  {pf['link']}: caught in {pf['iterations_to_detect']} iteration(s), "
                         f"{pf['seconds_to_detect']:.2f} s after onset; localized to {pf['localized_link']}"
                         + (f", {pf['iterations_detect_to_localize']} iteration(s) after detection"
                            if pf.get("iterations_detect_to_localize") is not None else ""))
        else:
            lines.append(f"  {pf['link']}: missed")
    return lines


def cost_lines(r: dict) -> list[str]:
    """What each fault cost the job and, drained, what the job got back (report.json's cost)."""
    out = []
    for c in r.get("cost") or []:
        def ms(v):
            return "-" if v is None else f"{v:.0f} ms"

        def s(v):
            return "-" if v is None else f"{v:.2f} s"

        def n(v):
            return "-" if v is None else f"{v:g}"
        out.append(f"cost of {c['link']}: iteration time {ms(c['before_ms'])} before the fault, {ms(c['during_ms'])} "
                   f"while it acted ({c['iterations_during']} iterations), {ms(c['after_drain_ms'])} after the drain "
                   f"(medians); retransmitted segments per iteration {n(c.get('retrans_before'))} / "
                   f"{n(c.get('retrans_during'))} / {n(c.get('retrans_after_drain'))}")
        out.append(f"  from the fault's start: detected {s(c['to_detect_s'])}, named {s(c['to_name_s'])}, "
                   f"drained {s(c['to_drain_s'])}")
    return out
