"""The detector on synthetic counter streams with known truth (analysis/model.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agent.detector import DetectorConfig, SwitchDetector, pulses_needed
from analysis.model import FabricModel, ModelSpec, simulate
from netns_testbed.topo import Fabric, FabricSpec

MiB = 1 << 20


def run(spec: ModelSpec, pulses: int, fault_from: int, cfg: DetectorConfig, switches=None, degraded=()):
    streams = simulate(spec, pulses, fault_from)
    fabric = Fabric(spec.fabric)
    oos = [l for t in spec.out_of_service for l in fabric.parse_links(t)]
    deg = [l for t in degraded for l in fabric.parse_links(t)]
    dets = {sw: SwitchDetector(fabric, sw, cfg, spec.weights, oos, deg) for sw in switches or fabric.switches}
    events, significant = [], {sw: 0 for sw in dets}
    for i in range(pulses):
        for sw, det in dets.items():
            for a in det.observe(streams[sw][i]):
                events.append((i, a))
            significant[sw] += det.significant
    return events, significant, dets


def first_alert(events, link):
    for i, a in events:
        if a.event == "alert" and (a.link == link or link in a.candidates):
            return i, a
    return None, None


@pytest.mark.parametrize("spray,alpha", [("random", 0.02), ("rrdst", 0.02), ("rr", 0.02)])
def test_false_alarms_within_configured_rate(spray, alpha):
    """Healthy streams: pulses with any significant test <= alpha per switch (Bonferroni bound)."""
    pulses, warm = 300, 12
    cfg = DetectorConfig(spray=spray, alpha=alpha, warmup=warm, max_window=64, spine_tests=False)
    _, significant, _ = run(ModelSpec(spray=spray, seed=11), pulses, pulses, cfg,
                            switches=["leaf0", "leaf1", "leaf2", "leaf3"])
    judged = 4 * (pulses - warm)
    rate = sum(significant.values()) / judged
    # allowed: alpha plus 3 binomial standard errors
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / judged), (rate, significant)


def test_zero_false_alarms_at_default_alpha():
    events, _, _ = run(ModelSpec(spray="rrdst", seed=3), 400, 400, DetectorConfig())
    assert [a for _, a in events] == []


@pytest.mark.parametrize("spray,size,rate", [("rrdst", 4 * MiB, 0.01), ("rrdst", 4 * MiB, 0.005),
                                             ("rr", 4 * MiB, 0.01), ("random", 64 * MiB, 0.01)])
def test_loss_caught_within_the_formula(spray, size, rate):
    """A loss on spine1->leaf2 is caught within the pulses the statistics allow, named by its candidates."""
    warm, onset = 12, 20
    cfg = DetectorConfig(spray=spray, warmup=warm)
    spec = ModelSpec(spray=spray, size=size, seed=5, faults={"spine1->leaf2": rate})
    model = FabricModel(spec)
    w, n = 0.25, model.pkts                         # leaf2 gets leaf1's ring traffic over 4 spines
    deficit = rate * w * (1 - w) * n
    # null variance per pulse: multinomial for random; rr/rrdst: the learned one (checked below)
    events, _, dets = run(spec, onset + 300, onset, cfg, switches=["leaf2"])
    det = dets["leaf2"]
    assert ("peer", 1, 2) in det.cells      # leaf1's traffic on uplink 1 is under test
    var = n * w * (1 - w) if spray == "random" else max(cfg.min_var, det._var_per_pkt(2) * n * cfg.var_inflation)
    k = pulses_needed(deficit, var, det.z_star())
    window = 1 << math.ceil(math.log2(k))          # the first power-of-two window that holds k pulses
    i, a = first_alert(events, "spine1->leaf2")
    assert a is not None, f"not caught; formula said {k} pulses"
    assert i - onset + 1 <= window, (i - onset + 1, k, window)
    assert set(a.candidates) == {"spine1->leaf2", "leaf1->spine1"}
    assert a.switch == "leaf2" and a.port == 1 and a.ifname == "spine1"
    lo, hi = a.rate_ci
    assert abs(a.estimated_rate - rate) < 0.5 * rate or lo <= rate <= hi


def test_formula_numbers_stated_in_the_notes():
    # random spraying, 4 MiB over 4 spines: n ~ 10,140 packets per source leaf per pulse
    n, w = 10140, 0.25
    z = 5.7
    k_random = pulses_needed(0.01 * w * (1 - w) * n, n * w * (1 - w), z)
    assert 150 < k_random < 400          # hundreds of iterations: the multinomial limit
    k_rrdst = pulses_needed(0.01 * w * (1 - w) * n, 1.0, z)
    assert k_rrdst == 1                  # one iteration with an exact split
    # 16x the message size -> 16x fewer pulses under random spraying
    assert pulses_needed(0.01 * w * (1 - w) * 16 * n, 16 * n * w * (1 - w), z) == math.ceil(k_random / 16)


def test_corruption_names_the_link():
    spec = ModelSpec(spray="rrdst", seed=2, corrupt={"leaf0->spine3": 0.015})
    events, _, _ = run(spec, 30, 15, DetectorConfig())
    i, a = first_alert(events, "leaf0->spine3")
    assert a is not None and i == 15
    corr = [a for _, a in events if a.kind == "corruption"]
    assert corr and corr[0].link == "leaf0->spine3" and corr[0].switch == "spine3"
    assert all(x.link == "leaf0->spine3" or "leaf0->spine3" in x.candidates for _, x in events if x.event == "alert")


def test_known_out_of_service_is_silent_and_new_fault_caught():
    spec = ModelSpec(spray="rrdst", seed=4, out_of_service=["leaf1<->spine2"], faults={"spine0->leaf3": 0.01})
    events, _, _ = run(spec, 40, 20, DetectorConfig())
    alerts = [a for _, a in events if a.event == "alert"]
    assert alerts, "new fault missed"
    assert all("spine0->leaf3" in a.candidates for a in alerts), [(a.switch, a.candidates) for a in alerts]
    assert all(a.port != 2 or not a.switch == "leaf1" for a in alerts)


def test_declared_degraded_link_not_tested():
    spec = ModelSpec(spray="rrdst", seed=6, faults={"spine1->leaf2": 0.02})
    events, _, _ = run(spec, 40, 0, DetectorConfig(), degraded=["spine1->leaf2"])
    assert [a for _, a in events if "spine1->leaf2" in a.candidates] == []


def test_learned_model_needs_no_shares_and_catches():
    spec = ModelSpec(spray="rrdst", seed=8, weights={"leaf1->spine0": 2.0}, faults={"spine2->leaf2": 0.01})
    # the learned model is not told the weights; it measures the shares
    fabric = Fabric(spec.fabric)
    streams = simulate(spec, 40, 20)
    det = SwitchDetector(fabric, "leaf2", DetectorConfig(model="learned"))
    alerts = [(i, a) for i in range(40) for a in det.observe(streams["leaf2"][i]) if a.event == "alert"]
    assert alerts and alerts[0][0] in (20, 21) and alerts[0][1].port == 2


def test_noise_pulses_ignored_and_one_alert_per_fault():
    fabric = Fabric(FabricSpec())
    det = SwitchDetector(fabric, "leaf2", DetectorConfig())
    streams = simulate(ModelSpec(seed=9, faults={"spine3->leaf2": 0.05}), 60, 15)
    from agent.pulse import PulseCounts

    noise = PulseCounts("leaf2", 0, np.zeros((6, 2, 6), np.int64), np.zeros((6, 2), np.int64))
    noise.ip[0, 0, 0] = 3  # a few pings
    events = []
    for pc in streams["leaf2"]:
        events += det.observe(pc)
        events += det.observe(noise)
    assert sum(1 for a in events if a.event == "alert") == 1
    assert det.pulses_used == 60


def test_pulse_shape_mismatch_is_an_error():
    fabric = Fabric(FabricSpec())
    det = SwitchDetector(fabric, "leaf0", DetectorConfig())
    from agent.pulse import PulseCounts

    with pytest.raises(ValueError, match="ports"):
        det.observe(PulseCounts("leaf0", 1, np.zeros((3, 2, 6), np.int64), np.zeros((3, 2), np.int64)))


def test_bad_config():
    from flowpulse.errors import SpecError

    for kw in (dict(model="magic"), dict(alpha=0), dict(alpha=2), dict(spray="x"), dict(warmup=1)):
        with pytest.raises(SpecError):
            DetectorConfig(**kw).validate()
