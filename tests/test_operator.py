"""What an operator runs beside the agent (no root): alert files that survive logrotate, /healthz,
logs as JSON lines."""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from agent.daemon import JsonLinesSink
from agent.metrics import STALL_S, health, serve
from flowpulse.cli import build_parser
from flowpulse.cmdbase import JsonLogFormatter
from tests.standins import free_port


def test_alert_file_reopened_after_logrotate_moves_it(tmp_path):
    path = tmp_path / "alerts.jsonl"
    sink = JsonLinesSink(path)
    sink({"n": 1})
    path.rename(tmp_path / "alerts.jsonl.1")          # logrotate, no copytruncate
    sink({"n": 2})
    (tmp_path / "alerts.jsonl").unlink()              # or removed outright
    sink({"n": 3})
    sink.close()
    assert [json.loads(l)["n"] for l in (tmp_path / "alerts.jsonl.1").read_text().splitlines()] == [1]
    assert [json.loads(l)["n"] for l in path.read_text().splitlines()] == [3]


def fake_agent(switch: str, last_poll: float):
    return SimpleNamespace(switch=switch, pulses=7, last_poll=last_poll, detector=SimpleNamespace(active={}),
                           reader=SimpleNamespace(resyncs=0, lost=0))





def test_healthz_is_ok_while_every_poll_loop_runs_and_503_when_one_stalls():
    fresh, stuck = fake_agent("leaf0", time.monotonic()), fake_agent("spine0", time.monotonic())
    ok, body = health([fresh, stuck])
    assert ok and body["status"] == "ok" and body["switches"]["leaf0"]["pulses"] == 7
    port = free_port()
    serve([fresh, stuck], port)
    url = f"http://127.0.0.1:{port}"
    assert json.loads(urllib.request.urlopen(url + "/healthz", timeout=5).read())["status"] == "ok"
    stuck.last_poll -= STALL_S + 1
    try:
        urllib.request.urlopen(url + "/healthz", timeout=5)
        raise AssertionError("a stalled poll loop must answer 503")
    except urllib.error.HTTPError as e:
        assert e.code == 503 and json.loads(e.read())["status"] == "stalled"


def test_metrics_still_served_beside_healthz():
    port = free_port()
    serve([], port)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "# HELP flowpulse_pulses" in text


def test_json_logs_are_one_object_a_line():
    rec = logging.LogRecord("flowpulse.agent", logging.WARNING, __file__, 1, "alert %s", ("leaf1->spine2",), None)
    out = json.loads(JsonLogFormatter().format(rec))
    assert out["level"] == "warning" and out["message"] == "alert leaf1->spine2" and out["logger"] == "flowpulse.agent"
    assert build_parser().parse_args(["agent", "--site", "x.yaml", "--log-json"]).log_json


def site_agents():
    from agent.daemon import AgentOptions, SwitchAgent
    from agent.detector import DetectorConfig
    from agent.site import site_from_dict, site_of_testbed
    from tests.test_site import fake_testbed

    site = site_from_dict(Path("site.yaml"), site_of_testbed(fake_testbed(), "leaf1"))
    opts = AgentOptions(cfg=DetectorConfig(), persist=False)
    return [SwitchAgent(site.deployment(), sw, opts, reader=None) for sw in ("leaf1", "spine2")]


def test_live_view_shows_switches_scores_and_incidents():
    from agent.liveview import render_text, score_bar

    incident = SimpleNamespace(incident_id="inc-leaf2->spine1-1", state="localized", kind="loss", rate=0.0123,
                               how="spine1's verdict: its link from leaf2 is lossy")
    tracker = SimpleNamespace(open=lambda: [incident])
    text = render_text(site_agents(), tracker)
    for word in ("leaf1", "spine2", "watching", "score / threshold", "inc-leaf2->spine1-1", "localized", "1.23%"):
        assert word in text, text
    assert score_bar(2.5).plain.startswith("█" * 20) and score_bar(0.0).plain.startswith("·" * 20)


def test_live_screen_keeps_log_lines_in_its_panel_and_gives_stderr_back():
    from agent.liveview import LiveScreen

    root = logging.getLogger()
    before = list(root.handlers)
    with LiveScreen() as screen:
        logging.getLogger("flowpulse.agent").warning("alert loss on leaf2->spine1")
        screen.update(site_agents())
        assert any("alert loss on leaf2->spine1" in line for line in screen.lines)
        assert all(h not in root.handlers for h in before)
    assert root.handlers == before


def test_metrics_scrapes_during_pulses_see_consistent_state(tmp_path):
    """A scrape loop beside a poll loop that judges pulses as fast as they come (a faulty leaf, so
    alerts open and incidents form while scrapes read them): no scrape fails, none sees a pulse half
    judged (an alert open in the detector that the agent has not counted yet; the judge is slowed
    down there so that an unlocked scrape would), and the pulse count never goes back."""
    import threading

    import numpy as np
    from prometheus_client import CollectorRegistry, generate_latest

    from agent.daemon import AgentOptions, SwitchAgent, make_tracker, run_agents
    from agent.deployment import Deployment
    from agent.detector import DetectorConfig
    from agent.metrics import AgentCollector
    from netns_testbed.topo import SprayMode
    from tests.synthetic import FABRIC, leaf_pulses

    stream = leaf_pulses(SprayMode.RRDST, 1.0, 40_000, 400, np.random.default_rng(5), fault=(1, 0.02, 100))

    class Reader:
        resyncs = lost = 0

        def __init__(self):
            self.it = iter(stream)

        def poll(self):
            return next(self.it, None)

        def close(self):
            pass

    dep = Deployment(name="synthetic", fabric=FABRIC, spray=SprayMode.RRDST, weights={}, out_of_service=(),
                     degraded=(), state_dir=tmp_path / "state", verdict_dir=tmp_path / "verdicts",
                     reload=lambda: dep)
    agent = SwitchAgent(dep, "leaf0", AgentOptions(cfg=DetectorConfig(), persist=False), Reader())
    judge = agent.detector.observe

    def slow_judge(pc):            # widen the moment between the detector's change and the agent's count
        events = judge(pc)
        if events:
            time.sleep(0.05)
        return events

    agent.detector.observe = slow_judge
    tracker = make_tracker([agent], reporter="test")
    reg = CollectorRegistry()
    reg.register(AgentCollector([agent], tracker))
    stop = threading.Event()
    loop = threading.Thread(target=run_agents, args=([agent], stop, 0.0), kwargs={"tracker": tracker})
    loop.start()
    seen, errors, torn = [], [], 0
    try:
        while loop.is_alive() and agent.pulses < len(stream):
            try:
                text = generate_latest(reg).decode()
            except Exception as e:           # noqa: BLE001 - any failure of a scrape is the finding
                errors.append(repr(e))
                break
            value = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                     if l and not l.startswith("#")}
            seen.append(next(v for k, v in value.items() if k.startswith("flowpulse_pulses")))
            open_alerts = sum(v for k, v in value.items() if k.startswith("flowpulse_alert_active{"))
            counted = sum(v for k, v in value.items() if k.startswith("flowpulse_alerts_total{"))
            torn += open_alerts > counted      # an open alert the agent has not counted yet: half a pulse
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not errors, errors
    assert torn == 0, f"{torn} scrapes saw a pulse half judged"
    assert len(seen) > 20 and seen == sorted(seen)
    assert agent.pulses == len(stream) and agent.alerts_total.get("loss", 0) >= 1
