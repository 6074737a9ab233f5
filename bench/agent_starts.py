#!/usr/bin/env python3
"""Agents started and restarted at random moments while a job runs: alerts and incidents they raise (root).

An agent that starts under traffic must judge whole pulses only (agent/reader.py: armed_ns). Builds a
testbed, runs a long healthy allreduce, and meanwhile starts agents one after another, each at a random
moment, for a random 4-9 s, then SIGTERM:

* ``site``: ``flowpulse agent --site`` inside a switch's namespace (its own counting program, attached
  port after port while packets flow), with a fresh state directory;
* ``site-restart``: the same switch's site agent again, continuing from the state the last one saved;
* ``testbed``: ``flowpulse agent --prefix P --switch S`` on the testbed's counters, continuing from its
  saved state (a restart, after the first).

Prints one line per start (kind, switch, pulses judged, pulses skipped, alerts, incidents) and the totals.

    sudo .venv/bin/python bench/agent_starts.py [--starts 24] [--seed 1]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.siteagents import REPO, flowpulse_argv  # noqa: E402
from netns_testbed import builder  # noqa: E402
from netns_testbed.topo import FabricSpec, namespace  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402

KINDS = ("site", "site-restart", "testbed")


def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def one_start(tb, out: Path, i: int, kind: str, switch: str, run_s: float, env: dict) -> dict:
    d = out / f"{i:02d}-{kind}-{switch}"
    d.mkdir(mode=0o700)
    common = ["--alerts", str(d / "alerts.jsonl"), "--incidents", str(d / "incidents.jsonl"), "--record",
              str(d / "pulses")]
    if kind == "testbed":
        argv = flowpulse_argv("agent", "--prefix", tb.prefix, "--switch", switch, *common)
        run_env = os.environ
    else:
        state = out / "state" / switch / ("fresh-%d" % i if kind == "site" else "kept")
        argv = flowpulse_argv("agent", "--site", str(out / "sites" / f"{switch}.yaml"), "--state-dir", str(state),
                              *common, netns=namespace(tb.prefix, switch))
        run_env = env
    log = d / "agent.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, cwd=REPO, env=run_env, stdout=subprocess.DEVNULL, stderr=f)
    end = time.time() + 120
    while "flowpulse.agent: watching" not in log.read_text():
        if proc.poll() is not None or time.time() > end:
            proc.kill()
            raise RuntimeError(f"agent {i} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    time.sleep(run_s)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    text = log.read_text()
    pulses = sum(len(lines(p)) for p in (d / "pulses").glob("*.jsonl"))
    alerts = [a for a in lines(d / "alerts.jsonl") if a.get("event") == "alert"]
    incidents = [e for e in lines(d / "incidents.jsonl") if e.get("event") == "open"]
    return {"start": i, "kind": kind, "switch": switch, "ran_s": round(run_s, 1), "rc": rc, "pulses": pulses,
            "skipped": len(re.findall(r"skipped \(it holds part of a burst\)", text)),
            "alerts": len(alerts), "incidents": len(incidents),
            "what": [f"{a['kind']} {a.get('link') or '|'.join(a['candidates'])} {a['estimated_rate']:.1%}"
                     for a in alerts]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prefix", default="fpstart")
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--spines", type=int, default=4)
    a = p.parse_args()
    rng = random.Random(a.seed)
    builder.down(a.prefix)
    tb = builder.up(a.prefix, FabricSpec(leaves=a.leaves, spines=a.spines, hosts_per_leaf=2))
    out = Path(tempfile.mkdtemp(prefix="fpstart-"))
    stop = threading.Event()
    rows: list[dict] = []
    try:
        (out / "sites").mkdir()
        r = subprocess.run(flowpulse_argv("fabric", "export-site", "--prefix", tb.prefix, "--all", "--dir",
                                          str(out / "sites")), cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        empty = out / "no-testbed-here"
        empty.mkdir()
        env = {**os.environ, "FLOWPULSE_RUN_DIR": str(empty)}      # site agents read no testbed state

        def job() -> None:
            k = 0
            while not stop.is_set():        # healthy allreduces back to back, for as long as the starts go on
                run_job(tb, JobSpec("allreduce", size=4 << 20, iterations=60, idle_ms=150), out / f"job{k}")
                k += 1

        th = threading.Thread(target=job, daemon=True)
        th.start()
        time.sleep(8)                       # the job under way
        for i in range(a.starts):
            kind = KINDS[i % len(KINDS)]
            switch = rng.choice(tb.fabric.switches)
            time.sleep(rng.uniform(0, 1.5))         # a random moment of the job's cycle
            row = one_start(tb, out, i, kind, switch, rng.uniform(4, 9), env)
            rows.append(row)
            print(f"{row['start']:3d} {row['kind']:13s} {row['switch']:7s} ran {row['ran_s']:4.1f} s  exit {row['rc']}  "
                  f"pulses {row['pulses']:3d}  skipped {row['skipped']}  alerts {row['alerts']}  incidents "
                  f"{row['incidents']}  {'; '.join(row['what'])}", flush=True)
        stop.set()
        th.join(timeout=120)
    finally:
        stop.set()
        builder.down(a.prefix)
    per_kind = ", ".join(f"{k}: {sum(r['kind'] == k for r in rows)}" for k in KINDS)
    print(f"{len(rows)} starts ({per_kind}): "
          f"{sum(r['pulses'] for r in rows)} pulses judged, {sum(r['skipped'] for r in rows)} skipped at start, "
          f"{sum(r['alerts'] for r in rows)} alerts, {sum(r['incidents'] for r in rows)} incidents "
          f"(run files in {out})")
    return 0 if not any(r["alerts"] or r["incidents"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
