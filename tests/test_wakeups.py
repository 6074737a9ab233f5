"""The agent between pulses (root): asleep until the kernel says a pulse opened, awake when it can have
closed; and agents started while a job runs judge only whole pulses."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from agent.daemon import IDLE_WAIT_S, AgentOptions, SwitchAgent, run_agents
from agent.detector import DetectorConfig
from analysis.siteagents import SiteAgents
from netns_testbed.topo import namespace
from workload.launcher import JobSpec, run_job

pytestmark = pytest.mark.root


def test_an_idle_agent_sleeps_and_a_pulse_wakes_it_when_it_closed(make_testbed):
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    a = SwitchAgent.on_testbed(tb, "leaf0", AgentOptions(cfg=DetectorConfig(), persist=False))
    assert a.reader.wake_fd is not None
    steps = [0]
    step = a.step

    def counted():
        steps[0] += 1
        return step()

    a.step = counted
    stop = threading.Event()
    th = threading.Thread(target=run_agents, args=([a], stop, 0.01), daemon=True)
    th.start()
    try:
        time.sleep(3)
        idle_steps = steps[0]
        assert idle_steps <= 3 / IDLE_WAIT_S + 2, idle_steps      # not one look per --poll-ms (300 in 3 s)
        h0, h1 = tb.fabric.hosts
        for burst in range(3):
            subprocess.run(["ip", "netns", "exec", namespace(tb.prefix, h0), "ping", "-c", "20", "-i", "0.002", "-q",
                            tb.fabric.host_ip(h1)], capture_output=True, check=True)
            end = time.time() + 2
            while a.pulses <= burst and time.time() < end:
                time.sleep(0.01)
            assert a.pulses == burst + 1, "the pulse was not read"
            # read once it had closed (a gap after its last packet), and not much later
            late_ms = (a.last_pulse_at * 1e9 - a.last_pulse.end_ns) / 1e6
            gap_ms = tb.state.gap_ms
            assert gap_ms <= late_ms <= gap_ms + 120, late_ms
            time.sleep(0.3)
        assert steps[0] - idle_steps < 60        # a handful of looks per pulse
    finally:
        stop.set()
        th.join(timeout=5)
        a.close()


def test_site_agents_started_while_a_job_runs_raise_nothing(make_testbed, tmp_path):
    """Every switch's site agent started (twice) during a healthy allreduce: their counting programs attach
    port after port while packets flow; the pulses they saw in part are skipped, not judged."""
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=2)
    done = threading.Event()
    result = {}

    def job():
        result["job"] = run_job(tb, JobSpec("allreduce", size=4 << 20, iterations=200, idle_ms=150),
                                tmp_path / "job")
        done.set()

    threading.Thread(target=job, daemon=True).start()
    time.sleep(8)                                  # the ranks are up and the collective runs
    rounds = []
    for r in range(2):
        with SiteAgents(tb, tmp_path / f"round{r}", record=True) as agents:
            time.sleep(5)
        rounds.append(agents)
        assert not done.is_set(), "the job ended before the agents ran under it: make it longer"
    done.wait(timeout=300)
    assert result["job"].ok, result["job"].failure
    for agents in rounds:
        assert set(agents.exit_codes.values()) == {143}, agents.exit_codes
        judged = {p.name: len(p.read_text().splitlines()) for p in (agents.out / "pulses").glob("*.jsonl")}
        assert len(judged) == 4 and min(judged.values()) >= 5, judged
        assert [e for e in agents.alerts() if e["event"] == "alert"] == []
        assert agents.incidents() == []
