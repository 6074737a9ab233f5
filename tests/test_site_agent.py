"""`flowpulse agent --site` on a running fabric (root): the testbed is one site among others.

Each switch namespace stands for a machine: the agent runs inside it (`ip netns exec`), knows
only its exported site file, attaches its own counting program ahead of the testbed's, and
reads no testbed state (its run directory points at an empty one). The testbed's own agents
are off; its datapath still sprays and injects the fault.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.experiment import FaultScheduler
from analysis.spec import parse_scheduled
from netns_testbed.topo import namespace
from workload.launcher import JobSpec, run_job

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parent.parent


def flowpulse(*args: str, env=None, netns: str | None = None, **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "flowpulse", *args]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return subprocess.Popen(argv, cwd=REPO, env=env, **kw)


def counting_filters(prefix: str, switch: str, ifname: str) -> str:
    out = []
    for hook in ("ingress", "egress"):
        out.append(subprocess.run(["tc", "-n", namespace(prefix, switch), "filter", "show", "dev", ifname, hook],
                                  capture_output=True, text=True).stdout)
    return "".join(out)


def wait_for(path: Path, text: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never said {text!r}: {path.read_text() if path.exists() else '(no file)'}")


def test_site_agents_catch_and_localize_a_one_percent_drop(make_testbed, tmp_path):
    tb = make_testbed()
    sites = tmp_path / "sites"
    sites.mkdir()
    assert flowpulse("fabric", "export-site", "--prefix", tb.prefix, "--all", "--dir", str(sites)).wait() == 0
    empty_run = tmp_path / "no-testbed-here"
    empty_run.mkdir()
    env = {**os.environ, "FLOWPULSE_RUN_DIR": str(empty_run)}   # any read of testbed state would fail
    state, verdicts = tmp_path / "state", tmp_path / "verdicts"
    procs = {}
    try:
        for sw in tb.fabric.switches:
            log = open(tmp_path / f"agent-{sw}.log", "w")
            procs[sw] = flowpulse("agent", "--site", str(sites / f"{sw}.yaml"), "--state-dir", str(state / sw),
                                  "--verdict-dir", str(verdicts), "--alerts", str(tmp_path / f"alerts-{sw}.jsonl"),
                                  "--incidents", str(tmp_path / f"incidents-{sw}.jsonl"), env=env,
                                  netns=namespace(tb.prefix, sw), stdout=log, stderr=subprocess.STDOUT)
        for sw in tb.fabric.switches:
            wait_for(tmp_path / f"agent-{sw}.log", "[agent] watching", 120)
        assert "fp_count_in" in counting_filters(tb.prefix, "spine1", "leaf2")
        job_dir = tmp_path / "workload"
        job_dir.mkdir()
        sched = FaultScheduler(tb, [parse_scheduled(tb.fabric, "leaf2->spine1:drop=0.01@iter=10")],
                               job_dir / "progress.jsonl", lambda m: None)
        sched.start()
        job = run_job(tb, JobSpec("allreduce", size=8 << 20, iterations=36, idle_ms=150), job_dir)
        sched.stop.set()
        assert job.ok, job.failure
        assert "leaf2->spine1" in sched.applied
        time.sleep(1.0)  # the last pulse closes and is judged
        for sw, p in procs.items():
            p.send_signal(signal.SIGTERM)
        for sw, p in procs.items():
            assert p.wait(timeout=30) == 0, (tmp_path / f"agent-{sw}.log").read_text()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    # detached cleanly: the testbed's own program is all that is left
    for sw in tb.fabric.switches:
        for port in tb.fabric.ports[sw]:
            text = counting_filters(tb.prefix, sw, port.ifname)
            assert "fp_count" not in text and ("fp_ingress" in text and "fp_egress" in text), (sw, text)
    assert list(empty_run.iterdir()) == []
    alerts = [json.loads(line) for sw in tb.fabric.switches
              for line in (tmp_path / f"alerts-{sw}.jsonl").read_text().splitlines()]
    incidents = [json.loads(line) for sw in tb.fabric.switches
                 for line in (tmp_path / f"incidents-{sw}.jsonl").read_text().splitlines()]
    raised = [a for a in alerts if a["event"] == "alert"]
    assert raised, "nothing caught the 1% drop"
    for a in raised:   # every alert points at the faulty link
        assert a["link"] == "leaf2->spine1" or (not a["link"] and "leaf2->spine1" in a["candidates"]), a
    named = {i["link"] for i in incidents if i.get("link")}
    assert named == {"leaf2->spine1"}, incidents
