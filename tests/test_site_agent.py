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
            wait_for(tmp_path / f"agent-{sw}.log", "flowpulse.agent: watching", 120)
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


UNIT = REPO / "deploy" / "systemd" / "flowpulse-agent.service"


def unit_capabilities() -> list[str]:
    for line in UNIT.read_text().splitlines():
        if line.startswith("CapabilityBoundingSet="):
            return line.split("=", 1)[1].split()
    raise AssertionError("the unit sets no CapabilityBoundingSet")


def test_unit_file_verifies_and_its_capabilities_are_enough(make_testbed, tmp_path):
    """systemd-analyze verify on the shipped unit; then the site agent run with only the unit's
    capability bounding set (setpriv, as systemd would set it) loads, counts, serves /healthz and detaches."""
    import shutil
    import urllib.request

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing (Debian: systemd)"
    unit = tmp_path / "flowpulse-agent.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/flowpulse", f"{sys.executable} -m flowpulse"))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    caps = ",".join("+" + c.removeprefix("CAP_").lower() for c in unit_capabilities())
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    sites = tmp_path / "sites"
    sites.mkdir()
    assert flowpulse("fabric", "export-site", "--prefix", tb.prefix, "--switch", "spine0",
                     "--out", str(sites / "spine0.yaml")).wait() == 0
    port = 19900 + (hash(tb.prefix) % 50)
    log = tmp_path / "agent.log"
    argv = ["ip", "netns", "exec", namespace(tb.prefix, "spine0"), "setpriv", f"--bounding-set=-all,{caps}",
            "--inh-caps=-all", sys.executable, "-m", "flowpulse", "agent", "--site", str(sites / "spine0.yaml"),
            "--state-dir", str(tmp_path / "state"), "--record", str(tmp_path / "rec"), "--log-json",
            "--metrics-port", str(port)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        wait_for(log, "watching spine0", 60)
        assert all(json.loads(line)["level"] for line in log.read_text().splitlines())   # --log-json
        h0, h1 = tb.fabric.hosts
        for _ in range(4):   # four pulses of pings, each followed by an idle gap
            subprocess.run(["ip", "netns", "exec", namespace(tb.prefix, h0), "ping", "-c", "20", "-i", "0.002",
                            "-q", tb.fabric.host_ip(h1)], capture_output=True, check=True)
            time.sleep(0.2)
        time.sleep(0.3)
        # /healthz answers from inside the namespace (the agent serves on its loopback)
        probe = subprocess.run(["ip", "netns", "exec", namespace(tb.prefix, "spine0"), sys.executable, "-c",
                                f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/healthz')"
                                ".read().decode())"], capture_output=True, text=True)
        health = json.loads(probe.stdout)
        assert health["status"] == "ok" and health["switches"]["spine0"]["pulses"] >= 3, (health, probe.stderr)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    pulses = [json.loads(line) for line in (tmp_path / "rec" / "pulses-spine0.jsonl").read_text().splitlines()]
    assert len(pulses) >= 3
    for p in pulses[-3:]:   # each direction of the 20 pings, half of them sprayed over spine0
        assert sum(map(sum, (d[0] for d in p["ip"]))) == sum(map(sum, (d[1] for d in p["ip"]))) > 0, p
    for port_ in tb.fabric.ports["spine0"]:
        assert "fp_count" not in counting_filters(tb.prefix, "spine0", port_.ifname)
