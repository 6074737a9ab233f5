"""Replay of the recorded 4x4 pulse traces (shared/data/pulse-traces) through the agent's detector."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.detector import DetectorConfig, pulses_needed
from analysis.replay import replay_dir
from analysis.traces import load_trace

# shared/ sits beside the checkout (also in CI); FLOWPULSE_TRACES points elsewhere
TRACES = Path(os.environ.get("FLOWPULSE_TRACES",
                             Path(__file__).resolve().parents[2] / "shared" / "data" / "pulse-traces"))
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="recorded traces not found beside the checkout")


@needs_traces
@pytest.mark.parametrize("tag", ["h_random", "h_rr", "h_rrdst"])
@pytest.mark.parametrize("model", ["analytic", "learned"])
def test_healthy_traces_are_silent(tag, model):
    res = replay_dir(TRACES / tag, DetectorConfig(model=model))
    assert res["pulses"] == 8 * 40
    assert [e for e in res["events"] if e["event"] == "alert"] == []


@needs_traces
@pytest.mark.parametrize("model", ["analytic", "learned"])
def test_rrdst_fault_caught_in_first_faulty_iteration(model):
    res = replay_dir(TRACES / "f1_rrdst", DetectorConfig(model=model))
    det = res["detection"]
    assert det["detected"] and det["iterations_to_detect"] == 1 and det["false_alerts"] == 0
    first = next(e for e in res["events"] if e["event"] == "alert")
    assert (first["switch"], first["port"], first["ifname"]) == ("leaf2", 1, "spine1")
    assert "spine1->leaf2" in first["candidates"]
    assert 0.005 < first["estimated_rate"] < 0.015


@needs_traces
def test_rr_fault_caught_within_its_statistics():
    """rr: residual sd ~4 packets; 15 healthy iterations only, so the learned variance keeps a
    wide upper bound; the 25 faulty iterations are enough (formula: ~10-16 at this bound)."""
    res = replay_dir(TRACES / "f1_rr", DetectorConfig())
    det = res["detection"]
    assert det["detected"] and det["false_alerts"] == 0
    assert det["iterations_to_detect"] <= 16


@needs_traces
@pytest.mark.parametrize("tag", ["f1_random", "f05_random"])
def test_random_spray_fault_below_its_statistical_limit(tag):
    """Random spraying: n ~ 2,560 per port, multinomial sd ~ 44; a 1% loss gives ~19 packets per
    pulse, so the formula needs hundreds of pulses; 25 faulty iterations cannot show it.
    The detector must stay silent rather than guess."""
    tr = load_trace(TRACES / tag)
    n = 4 * 2560
    k = pulses_needed(tr.fault_p * 0.25 * 0.75 * n, n * 0.25 * 0.75, 5.7)
    assert k > 100
    res = replay_dir(TRACES / tag, DetectorConfig())
    assert res["detection"]["false_alerts"] == 0
    assert not res["detection"]["detected"]
