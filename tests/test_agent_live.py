"""The agents on a real fabric with real gloo jobs (root): silence, detection, localisation."""
from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from agent.daemon import AgentOptions, SwitchAgent, run_agents
from agent.detector import DetectorConfig
from analysis.experiment import run_experiment
from analysis.rundir import validate_report
from analysis.spec import ExperimentSpec, parse_scheduled
from netns_testbed.builder import list_testbeds
from netns_testbed.ping import all_pairs
from netns_testbed.topo import Fabric, FabricSpec
from tests.conftest import idle_ms as stretch
from tests.conftest import new_prefix, wait_iteration
from workload.launcher import JobSpec

pytestmark = pytest.mark.root
FABRIC = Fabric(FabricSpec())


def experiment(tmp_path, faults=(), iterations=40, oos=(), size=2 << 20, idle_ms=150, workload="allreduce"):
    spec = ExperimentSpec(job=JobSpec(workload, size=size, iterations=iterations, idle_ms=stretch(idle_ms)), prefix=new_prefix(),
                          faults=[parse_scheduled(FABRIC, f) for f in faults], out_of_service=list(oos))
    rep = run_experiment(spec, tmp_path)
    assert spec.prefix not in list_testbeds()  # always torn down
    validate_report(rep)
    assert rep["workload"]["ok"], rep["workload"]
    return rep


def test_known_out_of_service_silent_new_fault_caught(tmp_path):
    rep = experiment(tmp_path, faults=["spine0->leaf3:drop=0.02@iter=16"], oos=["leaf1<->spine2"], iterations=36)
    det = rep["detection"]
    assert det["false_positives"] == 0, det["false_alerts"]
    assert det["true_positives"] == 1
    assert all("spine0->leaf3" in a["candidates"] or a["link"] == "spine0->leaf3" for a in rep["alerts"])
    f = rep["faults"][0]    # the injector's own counts: what it selected on the link, and dropped
    assert f["matched"] > 2000 and 0.012 < f["hit"] / f["matched"] < 0.028, f


def test_idle_fabric_with_background_noise_and_agent_restart(make_testbed, tmp_path):
    """Pings and ARP on an idle fabric make no pulses worth judging; an agent restarted in
    the middle of traffic resynchronises (first copy taken in an idle gap) without alerts."""
    tb = make_testbed()
    events: list[dict] = []
    opts = AgentOptions(cfg=DetectorConfig(), record=tmp_path, persist=False)
    agents = [SwitchAgent.on_testbed(tb, sw, opts, sinks=[events.append]) for sw in tb.fabric.switches]
    stop = threading.Event()
    th = threading.Thread(target=run_agents, args=(agents, stop, 0.01), daemon=True)
    th.start()
    for _ in range(3):
        all_pairs(tb, count=1)
        time.sleep(0.3)
    stop.set()
    th.join()
    assert events == []
    assert all(a.detector.pulses_used == 0 for a in agents)  # nothing big enough to judge
    from agent.liveview import render_text

    view = render_text(agents)
    assert all(sw in view for sw in tb.fabric.switches) and "watching" in view
    for a in agents:
        a.close()
    # restart: a fresh set of agents while a job runs
    from workload.launcher import run_job

    job = threading.Thread(target=run_job, args=(tb, JobSpec(size=1 << 20, iterations=30, idle_ms=120, ranks=8),
                                                 tmp_path / "job"), daemon=True)
    job.start()
    wait_iteration(tmp_path / "job" / "progress.jsonl", 10)   # restarted in the middle of the job's traffic
    agents = [SwitchAgent.on_testbed(tb, sw, opts, sinks=[events.append]) for sw in tb.fabric.switches]
    stop = threading.Event()
    th = threading.Thread(target=run_agents, args=(agents, stop, 0.01), daemon=True)
    th.start()
    job.join(timeout=120)
    time.sleep(0.5)
    stop.set()
    th.join()
    assert [e for e in events if e["event"] == "alert"] == []
    assert max(a.pulses for a in agents) > 5
    for a in agents:
        a.close()


def test_prometheus_endpoint(make_testbed):
    from agent.metrics import serve

    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    agents = [SwitchAgent.on_testbed(tb, sw, AgentOptions(cfg=DetectorConfig())) for sw in tb.fabric.switches]
    port = 19000 + (hash(tb.prefix) % 500)
    serve(agents, port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for name in ("flowpulse_pulses_total", "flowpulse_port_deviation_score", "flowpulse_score_threshold",
                 "flowpulse_agent_learning", "flowpulse_alerts_total"):
        assert name in body
    assert 'switch="spine1"' in body
    for a in agents:
        a.close()


def _stats(tb) -> dict:
    from netns_testbed.datapath import interface_stats

    return {sw: interface_stats(tb.ns(sw)) for sw in tb.fabric.switches}


class SlotSpy:
    """Open a switch's maps for a PulseReader and keep every pulse slot it reads (the last read of
    each pulse: a copy taken again after a racing packet replaces the first)."""

    def __init__(self, tb, switch: str) -> None:
        self.tb, self.switch, self.slots = tb, switch, {}

    def __call__(self):
        maps = self.tb.maps(self.switch, readonly=True)
        read = maps.read_pulse

        def spy(pulse):
            got = read(pulse)
            self.slots[pulse] = got.counts
            return got
        maps.read_pulse = spy
        return maps


def test_busy_machine_late_reader_loses_and_merges_no_pulse(make_testbed, tmp_path):
    """A real gloo job while two CPU hogs run at normal priority; each switch's reader sleeps half a
    second between polls (through several pulses). Every pulse comes whole and alone (consecutive
    numbers, none lost), and per port and direction the pulses' IPv4 counts add up to the kernel's
    own interface statistics over the same interval, less the non-IPv4 frames (ARP: they do not
    move the pulse clock, so one that comes in an idle gap joins a pulse already read; the
    cumulative totals count them)."""
    import subprocess
    import sys

    from agent.reader import PulseReader
    from netns_testbed.datapath import KINDS
    from workload.launcher import run_job

    ipv4 = [KINDS.index(k) for k in ("tcp_data", "tcp_ctrl", "other_ip", "bad_hdr")]
    non_ip = KINDS.index("non_ip")
    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=2)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    readers = {}
    try:
        time.sleep(0.3)                                    # idle: every pulse so far is closed
        spies = {sw: SlotSpy(tb, sw) for sw in tb.fabric.switches}
        readers = {sw: PulseReader(sw, tb.state.gap_ms, spies[sw]) for sw in tb.fabric.switches}
        first = {sw: r.maps.pulse_state()[0] for sw, r in readers.items()}
        base, base_tot = _stats(tb), {sw: r.maps.totals() for sw, r in readers.items()}
        got = {sw: [] for sw in readers}
        for sw, r in readers.items():                      # the reader starts at the pulse under way
            while (pc := r.poll()) is not None:
                got[sw].append(pc)
        most_at_once = 0
        job = threading.Thread(target=run_job, args=(tb, JobSpec(size=1 << 20, iterations=20, idle_ms=100, ranks=4),
                                                     tmp_path / "job"), daemon=True)
        job.start()
        while job.is_alive():
            time.sleep(0.5)
            for sw, r in readers.items():
                batch = []
                while (pc := r.poll()) is not None:
                    batch.append(pc)
                got[sw] += batch
                most_at_once = max(most_at_once, len(batch))
        for _ in range(20):                                # the last pulse closes, then a quiet copy
            time.sleep(0.3)
            end = _stats(tb)
            end_tot = {sw: r.maps.totals() for sw, r in readers.items()}
            for sw, r in readers.items():
                while (pc := r.poll()) is not None:
                    got[sw].append(pc)
            if all((r.maps.pulse_state()[0] + 1) % (1 << 24) == r.next_id for r in readers.values()) \
                    and _stats(tb) == end:
                break
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for r in readers.values():
            r.close()
    assert most_at_once >= 2, "the reader never slept through more than one pulse"
    for sw, r in readers.items():
        assert r.lost == 0 and r.resyncs == 0
        numbers = [pc.pulse for pc in got[sw]]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), (sw, numbers)
        assert all(pc.merged == 1 for pc in got[sw])
        later = [pc.pulse for pc in got[sw] if pc.pulse > first[sw]]
        assert len(later) >= 20, (sw, len(later))          # at least a pulse an iteration
        counted = sum(spies[sw].slots[p][:, :, :, ipv4].sum(axis=(2, 3)) for p in later)   # [port, dir]
        nonip = end_tot[sw][:, :, non_ip, 0] - base_tot[sw][:, :, non_ip, 0]
        totals = (end_tot[sw] - base_tot[sw])[:, :, :, 0].sum(axis=2)             # [port, dir], every kind
        for p in tb.fabric.ports[sw]:
            for d, kd in ((0, "rx"), (1, "tx")):
                kern = end[sw][p.ifname][f"{kd}_packets"] - base[sw][p.ifname][f"{kd}_packets"]
                assert totals[p.index, d] == kern, (sw, p.ifname, kd)                 # the cumulative counts
                assert counted[p.index, d] == kern - nonip[p.index, d], (sw, p.ifname, kd, int(counted[p.index, d]),
                                                                          kern, int(nonip[p.index, d]))
