"""What users would otherwise run, measured on the same runs as FlowPulse.

1. **Interface-counter monitor** (SNMP/node_exporter style): each fabric port's
   kernel error/drop counters plus each switch's IP header-error counter. It
   flags a link when its downstream port (or switch) counts errors or drops.
2. **Host retransmission monitor with per-flow blame** (tcpretrans / 007
   style): a host whose TCP retransmissions per iteration rise above its healthy
   level blames the links its flows can take; votes are summed per link and the
   top-voted link is the guess. Under spraying a flow takes every spine, so the
   votes spread over all of them.
"""
from __future__ import annotations

import statistics

from netns_testbed.datapath import interface_stats
from netns_testbed.nsutil import snmp
from netns_testbed.state import Testbed
from netns_testbed.topo import Fabric

ERR_KEYS = ("rx_dropped", "rx_errors", "tx_dropped", "tx_errors")
CONTROL_ONSET = 15  # healthy runs: the retransmission monitor is judged from this iteration on


def snapshot(tb: Testbed) -> dict:
    out: dict = {}
    for sw in tb.fabric.switches:
        ns = tb.ns(sw)
        ifs = interface_stats(ns)
        ip = snmp(ns)["Ip"]
        out[sw] = {"ifaces": {k: {e: v[e] for e in ERR_KEYS} for k, v in ifs.items()},
                   "ip": {k: ip.get(k, 0) for k in ("InHdrErrors", "InDiscards", "InCsumErrors")}}
    return out


def _counter_monitor(fabric: Fabric, before: dict, after: dict) -> dict:
    flagged_links, flagged_switches = set(), set()
    for sw in fabric.switches:
        for p in fabric.ports[sw]:
            d = {e: after[sw]["ifaces"][p.ifname][e] - before[sw]["ifaces"][p.ifname][e] for e in ERR_KEYS}
            if d["rx_dropped"] > 0 or d["rx_errors"] > 0:
                flagged_links.add(f"{p.peer}->{sw}")
            if d["tx_dropped"] > 0 or d["tx_errors"] > 0:
                flagged_links.add(f"{sw}->{p.peer}")
        dip = {k: after[sw]["ip"][k] - before[sw]["ip"][k] for k in after[sw]["ip"]}
        if dip["InHdrErrors"] > 0 or dip["InCsumErrors"] > 0:
            flagged_switches.add(sw)
    return {"flagged_links": sorted(flagged_links), "flagged_switches": sorted(flagged_switches)}


def _retrans_monitor(fabric: Fabric, job, faults: list[dict], z: float = 5.0) -> dict:
    its = job.iterations
    if not its:
        return {"detected": False, "guess": None, "votes": {}}
    t0 = min((f["start"] for f in faults), default=None)
    if t0 is None and len(its) > CONTROL_ONSET:
        # healthy run: judge from the same iteration on, so that an alarm here is a false one
        t0 = its[CONTROL_ONSET]["start"]
    pre = [it for it in its if t0 is None or it["end"] < t0]
    post = [it for it in its if t0 is not None and it["start"] >= t0]
    hosts = job.hosts
    n = len(hosts)
    votes: dict[str, float] = {}
    alarmed = []
    for r in range(n):
        base = [it["retrans_segs"][r] for it in pre[1:]] or [0]
        mu, sd = statistics.mean(base), statistics.pstdev(base)
        thresh = mu + z * max(sd, 1.0)
        hot = [it["retrans_segs"][r] for it in post if it["retrans_segs"][r] > thresh]
        if not hot:
            continue
        alarmed.append(hosts[r])
        # per-flow blame: the rank talks to both ring neighbours; each flow is sprayed
        # over every spine, so every leaf-spine link of its paths gets an equal share
        for peer in (hosts[(r + 1) % n], hosts[(r - 1) % n]):
            src_leaf, dst_leaf = fabric.host_leaf(hosts[r]), fabric.host_leaf(peer)
            path = [f"{hosts[r]}->{src_leaf}", f"{dst_leaf}->{peer}"]
            if src_leaf != dst_leaf:
                for s in fabric.spines:
                    path += [f"{src_leaf}->{s}", f"{s}->{dst_leaf}"]
            for link in path:
                votes[link] = votes.get(link, 0.0) + sum(hot) / len(path)
    top = max(votes.values()) if votes else 0
    best = sorted(l for l, v in votes.items() if v == top) if votes else []
    return {"detected": bool(alarmed), "alarmed_hosts": alarmed, "guess": best[0] if len(best) == 1 else None,
            "tied_top_links": best, "votes": {k: round(v, 1) for k, v in sorted(votes.items(), key=lambda kv: -kv[1])[:8]},
            "healthy_retrans_per_iter": round(statistics.mean(sum(it["retrans_segs"]) for it in pre) if pre else 0, 1)}


def evaluate(fabric: Fabric, before: dict, after: dict, job, faults: list[dict]) -> dict:
    counters = _counter_monitor(fabric, before, after)
    retrans = _retrans_monitor(fabric, job, faults)
    truth = [f["link"] for f in faults]
    for name, res, flagged in (("interface_counters", counters, counters["flagged_links"]),):
        res["detected"] = bool(flagged or counters["flagged_switches"])
        res["localized"] = [l for l in truth if l in flagged]
        res["switch_of_fault_flagged"] = [l for l in truth if l.split("->")[1] in counters["flagged_switches"]]
    retrans["localized"] = [l for l in truth if retrans.get("guess") == l]
    return {"interface_counters": counters, "host_retransmissions": retrans}
