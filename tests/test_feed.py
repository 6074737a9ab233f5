"""Per-pulse counts as JSON lines (agent/feed.py, ``flowpulse feed``): a recorded run fed through it gives
the replay's alerts and incidents; bad feeds stop with one line naming the line and the problem (no root)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.detector import DetectorConfig
from agent.feed import Judge, read_feed
from analysis.replay import replay_dir, run_as_feed
from netns_testbed.topo import FabricSpec, Link, SprayMode

RUNS = Path(__file__).parent / "data" / "recorded-runs"
ROOT = Path(__file__).resolve().parent.parent


def key(e: dict) -> tuple:
    return (e["event"], e.get("alert_id") or e.get("incident_id"), e.get("pulse"), e.get("link"))


@pytest.mark.parametrize("run", ["busy-ddp-two-faults", "busy-allgather-two-faults"])
def test_a_recorded_run_fed_as_lines_gives_the_replays_alerts_and_incidents(run):
    lines = list(run_as_feed(RUNS / run))
    header, pulses = read_feed(lines)
    judge = Judge(header.fabric, DetectorConfig(), header.spray, list(header.out_of_service))
    alerts, incidents = [], []
    for pc in pulses:
        a, i = judge.observe(pc)
        alerts += a
        incidents += i
    rep = replay_dir(RUNS / run, DetectorConfig())
    assert alerts and [key(e) for e in alerts] == [key(e) for e in rep["events"]]
    assert incidents == judge.tracker.history and len(incidents) > 0
    assert {i["link"] for i in incidents if i["event"] == "localized"} == {"leaf2->spine1", "spine3->leaf0"}


def flowpulse(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowpulse", *argv], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_the_cli_reads_a_feed_on_stdin(tmp_path):
    feed = "\n".join(run_as_feed(RUNS / "busy-ddp-two-faults")) + "\n"
    out = flowpulse("feed", "-", "--json", "--incidents", str(tmp_path / "inc.jsonl"), stdin=feed)
    assert out.returncode == 0, out.stderr[-2000:]
    events = [json.loads(l) for l in out.stdout.splitlines()]
    rep = replay_dir(RUNS / "busy-ddp-two-faults", DetectorConfig())
    assert [key(e) for e in events if e["type"] == "alert"] == [key(e) for e in rep["events"]]
    written = [json.loads(l) for l in (tmp_path / "inc.jsonl").read_text().splitlines()]
    assert written == [{k: v for k, v in e.items() if k != "type"} for e in events if e["type"] == "incident"]
    assert "switch-pulses" in out.stderr


HEADER = '{"flowpulse_feed": 1, "fabric": {"leaves": 2, "spines": 2, "hosts_per_leaf": 1}, "spray": "rrdst"}'
CHANGE = json.dumps({"epoch": 1, "action": "drain", "links": ["leaf0->spine1"], "out_of_service": ["leaf0->spine1"],
                     "t0_ns": 10, "t1_ns": 20, "weights": {"leaf1->spine0": 0.25}})
GOOD = json.dumps({"switch": "spine0", "pulse": 3, "ip": [[[0, 5, 0, 0], [0, 0, 5, 0]]] * 2, "bad": [[0, 0]] * 2})


@pytest.mark.parametrize("feed,problem", [
    ("", "feed is empty"),
    ("hello\n", "feed line 1: not JSON"),
    ('{"fabric": {}}\n', "not a feed header"),
    ('{"flowpulse_feed": 1, "fabric": {"leaves": 2}, "spray": "zigzag"}\n', "zigzag"),
    (HEADER + "\n" + GOOD + "\n{]\n", "feed line 3: not JSON"),
    (HEADER + "\n" + GOOD.replace("spine0", "spine9") + "\n", "feed line 2: unknown switch 'spine9'"),
    (HEADER + "\n" + GOOD + "\n\n" + GOOD + "\n", None),       # blank lines are skipped
    (HEADER + "\n" + GOOD.replace('"pulse": 3', '"pulse": -1') + "\n", "feed line 2: 'pulse'"),
    (HEADER + "\n" + json.dumps({"switch": "spine0", "pulse": 1, "ip": [[[0, 5, 0]]], "bad": [[0, 0]] * 2}) + "\n",
     "feed line 2: 'ip' has shape [1, 1, 3], this switch needs [2, 2, 4]"),
    (HEADER + "\n" + GOOD.replace("5", "-5", 1) + "\n", "feed line 2: 'ip' holds a count that is not a whole number"),
    (HEADER + "\n" + GOOD.replace('"pulse": 3', '"pulse": 3, "end_ns": -1') + "\n", "feed line 2: start_ns and end_ns"),
    (HEADER + "\n" + GOOD.replace('"pulse": 3', '"pulse": 3, "span": [[[1, 2, 3]]]') + "\n", "feed line 2: 'span' has shape"),
    (HEADER[:-1] + ', "spray_changes": {}}\n', "spray_changes must be a list"),
    (HEADER[:-1] + ', "spray_changes": [{"epoch": 1}]}\n', "feed line 1: spray change 1: a spray change is an object"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE.replace('"drain"', '"flip"') + ']}\n', "'action' 'flip'"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE.replace('leaf0->spine1"]', 'leaf9->spine1"]', 1) + ']}\n', "leaf9"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE.replace('"t1_ns": 20', '"t1_ns": 5') + ']}\n', "'t1_ns'"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE.replace('0.25', '-1') + ']}\n', "'weights'"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE + ', ' + CHANGE + ']}\n', "epochs rising"),
    (HEADER[:-1] + ', "spray_changes": [' + CHANGE + ']}\n' + GOOD + "\n", None),
])
def test_a_bad_feed_stops_with_one_line_and_exit_2(feed, problem):
    out = flowpulse("feed", "-", stdin=feed)
    if problem is None:
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 2, (out.returncode, out.stderr)
    err = [l for l in out.stderr.splitlines() if l.startswith("flowpulse: error:")]
    assert len(err) == 1 and problem in err[0], out.stderr


def test_missing_feed_file_and_bad_output_file(tmp_path):
    out = flowpulse("feed", str(tmp_path / "nope.feed"))
    assert out.returncode == 2 and "no such file" in out.stderr
    out = flowpulse("feed", "-", "--alerts", str(tmp_path / "no" / "a.jsonl"), stdin=HEADER + "\n")
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_a_judge_given_the_runs_spray_changes_judges_each_pulse_by_the_shares_of_its_time():
    """The counter model (4x4x2): from pulse 20 leaf2 sprays a quarter of its share on uplink 1 (a
    mitigation's canary). Judged with that change at its monotonic time (as a replay of a run that
    recorded it: report.json's mitigation.spray_changes), nothing alarms; judged with the first shares
    throughout (a replay before they were recorded), the missing three quarters read as a loss."""
    from analysis.model import FabricModel, ModelSpec
    from analysis.replay import in_time_order
    from netns_testbed.topo import SprayChange

    spec = ModelSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2), seed=6)
    m = FabricModel(spec)
    pulses: dict[str, list] = {sw: [] for sw in m.fabric.switches}
    for i in range(40):
        if i == 20:
            m.set_out_of_service([], {"leaf2->spine1": 0.25})
        for sw, pc in m.step().items():
            pc.start_ns, pc.end_ns = i * 10**9, i * 10**9 + 5 * 10**8
            pc.start_time, pc.end_time = float(i), i + 0.5
            pulses[sw].append(pc)
    link = Link("leaf2", "spine1")
    change = SprayChange(1, "weight", (link,), (), 19_700_000_000, 19_800_000_000, (("leaf2->spine1", 0.25),))
    order = in_time_order(pulses)

    def alerts(changes):
        judge = Judge(m.fabric, DetectorConfig(), SprayMode.RRDST, changes=changes)
        return [e for pc in order for e in judge.observe(pc)[0] if e["event"] == "alert"]

    assert alerts([change]) == []
    wrong = alerts([])
    assert any(e["link"] == "leaf2->spine1" or "leaf2->spine1" in e["candidates"] for e in wrong), wrong


def test_a_mitigated_run_is_replayed_with_its_canary_and_drain(monkeypatch):
    """A live run with `--mitigate` (4x4x2, allreduce 2 MiB, 2% on leaf2->spine1 from iteration 15): the
    agents cut the uplink to a canary share, named it and drained it. Replayed with the spray changes its
    report keeps, spine1 reads the fault's rate on the canary pulse and nothing is left to judge on the
    drained link; the fault is named as live and nothing healthy is. With its first shares throughout
    (a replay before the changes were kept) the canary pulse reads the missing three quarters as a loss."""
    import analysis.replay as replay
    from agent.detector.verdict import evidence_from

    run = RUNS / "mitigated-canary-then-drain"
    report = json.loads((run / "report.json").read_text())
    when = {a["action"]: a["time"] for a in report["mitigation"]["actions"]}
    assert [c["action"] for c in report["mitigation"]["spray_changes"]] == ["weight", "drain", "weight"]

    def canary_pulse():
        judge, _ = replay.judged_run(run)
        ledger = judge.detectors["spine1"].owner.ledger
        return evidence_from(ledger, 2, [(when["canary"], when["drain"])], "leaf2->spine1", "spine1", False, 0.02)

    ev = canary_pulse()
    assert ev.pulses >= 1 and abs(ev.rate - 0.02) < 0.015, ev
    det = replay_dir(run, DetectorConfig())["detection"]
    assert det["false_positives"] == 0 and det["incidents_naming_healthy_links"] == []
    assert [f["localized_link"] for f in det["per_fault"]] == ["leaf2->spine1"], det["per_fault"]
    monkeypatch.setattr(replay, "spray_changes", lambda *a: [])
    assert canary_pulse().rate > 0.5


@pytest.mark.parametrize("bad, problem", [({"action": "flip"}, "action"), ({"links": ["leaf9->spine1"]}, "leaf9"),
                                          ({"t0_ns": -1}, "t0_ns")])
def test_a_runs_malformed_spray_change_stops_the_replay_with_one_line(tmp_path, monkeypatch, bad, problem):
    import shutil

    import analysis.rundir
    from netns_testbed.errors import SpecError

    run = tmp_path / "run"
    shutil.copytree(RUNS / "mitigated-canary-then-drain", run)
    report = json.loads((run / "report.json").read_text())
    report["mitigation"]["spray_changes"][0].update(bad)
    (run / "report.json").write_text(json.dumps(report))

    def no_pulses(*a):
        raise AssertionError("pulses read before the report's spray changes were checked")

    monkeypatch.setattr(analysis.rundir, "load_pulses", no_pulses)
    with pytest.raises(SpecError) as e:
        replay_dir(run, DetectorConfig())
    assert problem in str(e.value) and "\n" not in str(e.value), e.value


def test_a_mitigated_run_fed_as_lines_carries_its_spray_changes_and_gives_the_replays_alerts():
    """The feed's header carries the run's spray changes (the canary, the drain): a feed reader judges the
    canary's pulses by the canary's shares, as the replay and the live agents did. Without them in the
    header, the reader raises alerts the replay does not."""
    run = RUNS / "mitigated-canary-then-drain"
    lines = list(run_as_feed(run))
    header, pulses = read_feed(lines)
    assert [c.action for c in header.changes] == ["weight", "drain", "weight"]
    rep = replay_dir(run, DetectorConfig())

    def judged(changes) -> list[dict]:
        judge = Judge(header.fabric, DetectorConfig(), header.spray, list(header.out_of_service), changes=changes)
        return [e for pc in read_feed(lines)[1] for e in judge.observe(pc)[0]]

    assert [key(e) for e in judged(list(header.changes))] == [key(e) for e in rep["events"]]
    assert [key(e) for e in judged([])] != [key(e) for e in rep["events"]]
    out = flowpulse("feed", "-", "--json", stdin="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr[-2000:]
    alerts = [json.loads(l) for l in out.stdout.splitlines() if json.loads(l)["type"] == "alert"]
    assert [key(e) for e in alerts] == [key(e) for e in rep["events"]]
