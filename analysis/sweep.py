"""A grid of experiments: detection rate, false alarms, time to detect, localisation,
for FlowPulse and the two baselines measured on the same runs."""
from __future__ import annotations

import itertools
import json
import random
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import logging

from analysis.experiment import run_experiment
from analysis.spec import ExperimentSpec, parse_scheduled
from netns_testbed.errors import SpecError
from netns_testbed.faults import FaultKind
from netns_testbed.topo import Fabric

# the kinds a rate sweeps: a share of packets (drop, corrupt) or of flows (partial)
SWEEP_KINDS = (FaultKind.DROP, FaultKind.CORRUPT, FaultKind.PARTIAL)


log = logging.getLogger("flowpulse.sweep")


@dataclass
class SweepSpec:
    base: ExperimentSpec
    kinds: list[FaultKind] = field(default_factory=lambda: [FaultKind.DROP, FaultKind.CORRUPT])
    rates: list[float] = field(default_factory=lambda: [0.005, 0.01, 0.02])
    links: int = 2                 # random leaf-spine links per (kind, rate)
    seeds: list[int] = field(default_factory=lambda: [0])
    fault_at: int = 15

    def validate(self) -> "SweepSpec":
        n = len(Fabric(self.base.fabric).fabric_links())
        if not 1 <= self.links <= n:
            raise SpecError(f"bad --links {self.links}: this fabric has {n} directed leaf-spine links (1..{n})")
        return self

    def fault(self, fabric: Fabric, kind: FaultKind, rate: float, link: str):
        """One point's fault: ``kind`` at ``rate`` (of packets; of flows for partial) on ``link``, on from
        iteration ``fault_at``."""
        return parse_scheduled(fabric, f"{link}:{kind}={rate:g}@iter={self.fault_at}")

    def points(self) -> list[tuple[FaultKind, float, str, int]]:
        fabric = Fabric(self.base.fabric)
        pts = []
        for kind, rate, seed in itertools.product(self.kinds, self.rates, self.seeds):
            rng = random.Random(f"{kind}{rate}{seed}")
            for link in rng.sample(fabric.fabric_links(), self.links):
                pts.append((kind, rate, link.name, seed))
        return pts


def run_sweep(sw: SweepSpec, out: Path, tick: Callable[[int, int, dict], None] | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    pts = sw.points()
    fabric = Fabric(sw.base.fabric)
    for i, (kind, rate, link, seed) in enumerate(pts):
        run_dir = out / f"{i:03d}-{kind}-{rate:g}-{link.replace('->', '_')}-s{seed}"
        spec = replace(sw.base, seed=seed, faults=[sw.fault(fabric, kind, rate, link)])
        spec.job = replace(sw.base.job, seed=seed)
        try:
            rep = run_experiment(spec.validate(), run_dir, progress=log.debug)
            row = summarize_run(rep, kind, rate, link, seed)
        except Exception as e:  # one failed point must not lose the sweep
            row = {"kind": kind, "rate": rate, "link": link, "seed": seed, "error": f"{type(e).__name__}: {e}"}
        row["run"] = run_dir.name
        rows.append(row)
        (out / "sweep.json").write_text(json.dumps(rows, indent=1))
        if tick:
            tick(i + 1, len(pts), row)
    return rows


def summarize_run(rep: dict, kind: str, rate: float, link: str, seed: int) -> dict:
    det = rep["detection"]
    pf = det["per_fault"][0] if det["per_fault"] else {}
    b = rep["baselines"]
    ic, hr = b["interface_counters"], b["host_retransmissions"]
    hit = rep["faults"][0].get("hit") if rep.get("faults") else None
    return {"kind": kind, "rate": rate, "link": link, "seed": seed, "job_ok": rep["workload"].get("ok"),
            "fault_hit": hit,
            "detected": bool(pf.get("detected")), "iterations_to_detect": pf.get("iterations_to_detect"),
            "seconds_to_detect": pf.get("seconds_to_detect"), "localized": bool(pf.get("localization_correct")),
            "iterations_detect_to_localize": pf.get("iterations_detect_to_localize"),
            "false_positives": det["false_positives"], "healthy_iterations": det["healthy_iterations"],
            "faulty_iterations": len(rep["iterations"]) - det["healthy_iterations"],
            "counters_detected": bool(ic.get("detected")), "counters_localized": bool(ic.get("localized")),
            "retrans_detected": bool(hr.get("detected")), "retrans_localized": bool(hr.get("localized"))}


def table(rows: list[dict]) -> list[dict]:
    """One line per (kind, rate): the sweep's headline figures."""
    out = []
    good = [r for r in rows if "error" not in r]
    for (kind, rate), grp in itertools.groupby(sorted(good, key=lambda r: (r["kind"], r["rate"])),
                                               key=lambda r: (r["kind"], r["rate"])):
        grp = list(grp)
        itd = sorted(r["iterations_to_detect"] for r in grp if r["detected"] and r["iterations_to_detect"])
        healthy = sum(r["healthy_iterations"] for r in grp)
        n = len(grp)
        out.append({
            "kind": kind, "rate": rate, "runs": n,
            "detection_rate": sum(r["detected"] for r in grp) / n,
            "fa_per_1000_healthy_iters": round(1000 * sum(r["false_positives"] for r in grp) / max(healthy, 1), 2),
            "median_iters_to_detect": statistics.median(itd) if itd else None,
            "p95_iters_to_detect": itd[min(len(itd) - 1, int(0.95 * len(itd)))] if itd else None,
            "localization_accuracy": sum(r["localized"] for r in grp) / n,
            "localized_within_1_iter": sum(r["localized"] and r.get("iterations_detect_to_localize") is not None
                                           and r["iterations_detect_to_localize"] <= 1 for r in grp) / n,
            "counters_detect": sum(r["counters_detected"] for r in grp) / n,
            "counters_localize": sum(r["counters_localized"] for r in grp) / n,
            "retrans_detect": sum(r["retrans_detected"] for r in grp) / n,
            "retrans_localize": sum(r["retrans_localized"] for r in grp) / n,
        })
    return out


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tab = table(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for kind in sorted({t["kind"] for t in tab}):
        pts = [t for t in tab if t["kind"] == kind]
        xs = [100 * t["rate"] for t in pts]
        axes[0].plot(xs, [t["detection_rate"] for t in pts], marker="o", label=f"FlowPulse, {kind}")
        axes[0].plot(xs, [t["counters_detect"] for t in pts], marker="x", ls=":", label=f"interface counters, {kind}")
        axes[0].plot(xs, [t["retrans_detect"] for t in pts], marker="s", ls="--", label=f"host retransmissions, {kind}")
        axes[1].plot(xs, [t["localization_accuracy"] for t in pts], marker="o", label=f"FlowPulse, {kind}")
        axes[1].plot(xs, [t["counters_localize"] for t in pts], marker="x", ls=":", label=f"interface counters, {kind}")
        axes[1].plot(xs, [t["retrans_localize"] for t in pts], marker="s", ls="--", label=f"retransmission blame, {kind}")
    rates = sorted({100 * t["rate"] for t in tab})
    for ax, title in zip(axes, ("detected (fraction of runs)", "localized to the right link")):
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("fault rate (%)")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def rescore(out: Path) -> list[dict]:
    """Judge every run of a sweep again from its recorded counters (same detector code,
    current parameters and localizer); baselines are kept from each run's report."""
    from agent.detector import DetectorConfig
    from analysis.replay import replay_dir

    rows = json.loads((out / "sweep.json").read_text())
    for row in rows:
        if "error" in row:
            continue
        det = replay_dir(out / row["run"], DetectorConfig())["detection"]
        pf = det["per_fault"][0] if det["per_fault"] else {}
        row.update({"detected": bool(pf.get("detected")), "iterations_to_detect": pf.get("iterations_to_detect"),
                    "seconds_to_detect": pf.get("seconds_to_detect"),
                    "localized": bool(pf.get("localization_correct")),
                    "iterations_detect_to_localize": pf.get("iterations_detect_to_localize"),
                    "false_positives": det["false_positives"]})
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    return rows
