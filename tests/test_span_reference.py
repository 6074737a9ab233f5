"""The owners' same-packet reference (sequence spans) on streams and runs with known truth: its noise
model learns the factors it was given, its samples read the loss they were made with, the ledger's
weights do not follow a pulse's own losses, the onset it picks is the loss's, an ambiguous alert
settled by the spine's and the leaf's evidence side by side is wrong within the verdict's budget, and a
recorded live run the balance could not localize is named one iteration after detection.

The kernel side (what the sums count, retransmissions never new) is tests/test_datapath_unit.py's."""
from __future__ import annotations

import json
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from agent.detector import DetectorConfig
from agent.detector.checks import SPAN_PRIOR_E, SPAN_PRIOR_R, ResentLevel, SpineCheck, span_samples
from agent.detector.noise import SpanNoise
from agent.detector.verdict import (DECIDE_LR, Ledger, LinkEvidence, Reference, Verdict, evidence_from,
                                    path_evidence, settle)
from agent.pulse import SPAN_BYTES, SPAN_FIELDS, SPAN_FIRST, SPAN_NEW, SPAN_RESENT
from analysis.model import ModelSpec, simulate
from analysis.replay import replay_dir
from netns_testbed.topo import Fabric, FabricSpec, SprayMode

RUN = Path(__file__).parent / "data" / "recorded-runs" / "span-drop-0.5pct-spine0-leaf1"
FIRST, RESENT, NEW, SPAN = SPAN_FIRST, SPAN_RESENT, SPAN_NEW, SPAN_BYTES
MSS = 1448


# -- the noise model ---------------------------------------------------------------------------------

def test_span_noise_learns_both_factors_from_streams_with_known_truth():
    """Deficits drawn with V = 0.002 e + 3 R (a quarter of the cells without resent segments) from a prior
    of 0.0033 and 4.8: after 4,000 cells each factor is within 10% of the truth (the estimators' sd is
    about 3% and 4% of it here: the bound is over 3 sd)."""
    rng = np.random.default_rng(1)
    noise = SpanNoise(0.0033, 4.8, prior_dof=20, floor=0.25)
    for _ in range(1000):
        e = rng.uniform(1000, 4000, 4)
        R = np.where(rng.random(4) < 0.25, 0.0, rng.integers(1, 40, 4))
        r = rng.normal(0.0, np.sqrt(0.002 * e + 3.0 * R))
        u = np.stack([e, R], axis=-1)
        noise.learn(*noise.sample(r, u, np.ones(4, bool)))
    phi_e, phi_r = noise.phis
    assert abs(phi_e / 0.002 - 1) < 0.1 and abs(phi_r / 3.0 - 1) < 0.1, noise.phis


def test_span_noise_state_round_trips_and_refuses_another_prior():
    a = SpanNoise(0.0033, 4.8, 20, 0.25)
    a.learn(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    b = SpanNoise(0.0033, 4.8, 20, 0.25)
    b.load(a.state())
    assert np.allclose(a.phis, b.phis)
    with pytest.raises(ValueError):
        SpanNoise(0.01, 4.8, 20, 0.25).load(a.state())


# -- samples from the sums -------------------------------------------------------------------------

def sums(first: float, resent: float, share: float, mss: int = MSS) -> np.ndarray:
    """One cell's sums: ``first`` new segments of ``mss`` bytes, the flows' spans ``first / share`` segments."""
    out = np.zeros(len(SPAN_FIELDS))
    out[FIRST], out[RESENT], out[NEW], out[SPAN] = first, resent, first * mss, first / share * mss
    return out


def test_span_samples_read_the_loss_the_sums_were_made_with():
    """Four cells whose flows spanned 10,000 segments at share 1/4: 2,500 expected; 1% of them lost in
    the second, none in the first, a surplus in the third (a late copy counted new), a cell with too
    few segments not judged."""
    sp = np.stack([sums(2500, 0, 0.25), sums(2475, 9, 0.25), sums(2503, 0, 0.25), sums(5, 0, 0.25)])
    sp[1:3, SPAN] = 10_000 * MSS                    # the spans are the flows', whatever the port lost or gained
    smp = span_samples(sp, np.full(4, 0.25), np.ones(4, bool), min_pkts=20)
    assert smp.mask.tolist() == [True, True, True, False]
    assert np.allclose(smp.s[:3], 2500) and np.allclose(smp.r[:3], [0, 25, -3])
    assert np.allclose(smp.r[:2] / smp.s[:2], [0.0, 0.01])
    assert smp.u[1].tolist() == [2500.0, 9.0]


def test_a_cell_whose_flows_lost_every_segment_is_judged_with_the_ports_segment_size():
    """A spine's cells per destination leaf (SpineCheck._span): one whose flows lost every segment into
    the port (a flow-selective blackhole) has spans from their ACKs and nothing new. Without a segment
    seen the cell cannot size its own; the port's mean segment stands in, and the cell reads a loss of
    all it should have had. Without ``seg_unseen`` it is not judged at all (nothing seen)."""
    sp = np.stack([sums(2500, 0, 0.25), sums(0, 0, 0.25), sums(8, 0, 0.25)])
    sp[1, SPAN] = 400 * MSS                         # 100 segments expected through this spine, none came
    sp[2, SPAN] = 400 * MSS                         # 8 of 100 came
    plain = span_samples(sp, np.full(3, 0.25), np.ones(3, bool), min_pkts=20)
    assert plain.mask.tolist() == [True, False, False]
    smp = span_samples(sp, np.full(3, 0.25), np.ones(3, bool), min_pkts=20, seg_unseen=np.full(3, float(MSS)))
    assert smp.mask.tolist() == [True, True, True]
    assert np.allclose(smp.r / smp.s, [0.0, 1.0, 0.92])
    unsized = span_samples(sp, np.full(3, 0.25), np.ones(3, bool), min_pkts=20, seg_unseen=np.full(3, np.inf))
    assert unsized.mask.tolist() == [True, False, False]     # a port that saw no segment sizes nothing


def test_the_ledger_weighs_a_pulse_by_its_cells_usual_resent_level_not_its_own():
    """A loss's retransmissions are the same pulse's resent segments: weighed by its own, a pulse that lost
    more counts less and the rate reads low. The level is what came before."""
    lvl = ResentLevel((1,))
    u = lambda R: np.array([[2500.0, R]])   # noqa: E731
    assert lvl.weights(u(4), np.array([True]))[0, 1] == 4            # nothing before: its own
    assert lvl.weights(u(40), np.array([True]))[0, 1] == 4           # the level before it
    assert lvl.weights(u(4), np.array([True]))[0, 1] == pytest.approx(0.8 * 4 + 0.2 * 40)


def test_a_spine_replayed_with_spans_reads_the_models_loss_rate_in_its_ledger():
    """The counter model with a 1% drop on leaf1->spine2 (4x4x2, 4 MiB): spine2's ledger reads it on port 1
    to within 0.15% over the 60 faulty pulses, and the healthy ports read no loss."""
    spec = ModelSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2), faults={"leaf1->spine2": 0.01}, seed=3)
    out = simulate(spec, 120, fault_from=60)
    chk = SpineCheck(Fabric(spec.fabric), "spine2", SprayMode.RRDST, DetectorConfig(), {}, [], set())
    for i, pc in enumerate(out["spine2"]):
        pc.start_time = float(i)
        chk.samples(pc)
    assert chk.reference is Reference.SPAN
    rates = [evidence_from(chk.ledger, x, 60.0, f"leaf{x}->spine2", "spine2", False, 0.0).rate for x in range(4)]
    assert abs(rates[1] - 0.01) < 0.0015, rates
    assert all(abs(r) < 0.0015 for i, r in enumerate(rates) if i != 1), rates


def test_the_model_keeps_the_live_references_healthy_scatter():
    """Healthy pulses of the model (4x4x2, 4 MiB rrdst): a spine port's per-pulse rate scatters 0.08-0.2%
    (live: 0.11% median robust sd, 0.17% rms; bench/span_floor.py on a live sweep)."""
    spec = ModelSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2), seed=5)
    out = simulate(spec, 150)
    fab = Fabric(spec.fabric)
    sds = []
    for k in range(4):
        chk = SpineCheck(fab, f"spine{k}", SprayMode.RRDST, DetectorConfig(), {}, [], set())
        rates = np.array([(lambda s: s.r / s.s)(chk._span(pc)[0]) for pc in out[f"spine{k}"]])
        sds += list(rates.std(axis=0))
    assert 0.0008 < np.median(sds) < 0.002, sds


# -- onset and verdicts on streams with known truth -------------------------------------------------

def ledger_of(rates: list[float], s: float = 2500.0, v: float = 8.0) -> Ledger:
    """A span ledger of one cell whose pulse t (start time t) read ``rates[t]``."""
    led = Ledger(1, reference=Reference.SPAN)
    for t, q in enumerate(rates):
        led.add(float(t), np.array([q * s]), np.array([v]), np.array([s]), np.zeros(1), np.array([True]))
    return led


def test_onset_is_the_losss_first_pulse_not_the_alarms_earlier_guess():
    """Healthy pulses at 0, then a 2% loss from pulse 3: from an alarm onset at pulse 1 the window starts at
    3. A first faulty pulse that read half the rate by chance stays in (ONSET_GAIN)."""
    led = ledger_of([0.0, 0.0005, -0.0004, 0.02, 0.021, 0.019])
    assert led.onset(0, 1.0) == 3.0
    led = ledger_of([0.0, 0.0003, 0.008, 0.02, 0.021])
    assert led.onset(0, 2.0) == 2.0
    assert Ledger(1, reference=Reference.SPAN).onset(0, 0.0) is None


def test_span_evidence_has_no_timing_term_and_its_sd_is_the_null_one_under_a_loss():
    """A 2% loss's pulses scatter by their binomial noise (sd 0.28% at 2,500 segments): that is no sign
    against the model, so the evidence's sd stays the null noise over the window, not inflated."""
    rng = np.random.default_rng(2)
    rates = list(0.02 + rng.normal(0, math.sqrt(8.0) / 2500, 6) + rng.normal(0, math.sqrt(0.02 / 2500), 6))
    ev = evidence_from(ledger_of(rates), 0, 0.0, "x", "o", False, 0.02)
    null_sd = math.sqrt(8.0 / 6) / 2500
    assert ev.reference is Reference.SPAN and ev.sd == pytest.approx(null_sd, rel=0.35)


def test_settling_with_both_ends_evidence_is_wrong_within_its_budget_and_quick():
    """Gaussian streams at the live noise (null sd 0.11% per pulse at each end, 2,575 segments a pulse,
    the loss's binomial noise shared by both ends when upstream), 0.5, 1 and 2% losses, 400 faults each
    way: wrong decisions under 1/DECIDE_LR of all; the median decision by the second pulse."""
    rng = np.random.default_rng(7)
    n_seg, null = 2575.0, 0.0011
    wrong, pulses = 0, []
    trials = 0
    for p in (0.005, 0.01, 0.02):
        for upstream in (True, False):
            for _ in range(400):
                trials += 1
                q_rows, p_rows = [], []
                for k in range(1, 9):
                    lost = rng.binomial(int(n_seg), p) / n_seg            # the same packets at both ends
                    q_rows.append((lost if upstream else 0.0) + rng.normal(0, null))
                    p_rows.append(lost + rng.normal(0, null))
                    sd = null / math.sqrt(k)
                    ev = LinkEvidence("up", "spine", float(np.mean(q_rows)), sd, k, False, Reference.SPAN)
                    verdict, _ = settle(ev, float(np.mean(p_rows)), sd, model_error=0.0)
                    if verdict is not Verdict.UNDECIDED:
                        wrong += verdict is not (Verdict.UPSTREAM if upstream else Verdict.DOWNSTREAM)
                        pulses.append(k)
                        break
    assert wrong / trials < 1 / DECIDE_LR, wrong
    assert np.median(pulses) <= 2 and len(pulses) == trials


def test_path_evidence_reports_the_window_it_judged():
    ev = path_evidence(ledger_of([0.0, 0.0, 0.0, 0.01, 0.01, 0.011]), 0, 1.0, "leaf1->spine0->leaf0", "leaf0")
    assert ev.start == 3.0 and ev.pulses == 3 and abs(ev.rate - 0.0103) < 1e-3


# -- a recorded live run -----------------------------------------------------------------------------

def test_a_recorded_run_the_balance_left_unnamed_is_named_one_iteration_after_detection(monkeypatch):
    """Live (0.5% on spine0->leaf1, 4x4x2, 4 MiB) the agents judged by the balance and never named the link
    in 15 faulty iterations. Replayed with its sequence spans the fault is named within one iteration
    of detection and nothing healthy is named; replayed with the spans left out (the balance) it takes
    more than two."""
    det = replay_dir(RUN, DetectorConfig())["detection"]
    fault = det["per_fault"][0]
    assert det["false_positives"] == 0 and det["incidents_naming_healthy_links"] == []
    assert fault["localization_correct"] and fault["iterations_detect_to_localize"] <= 1, fault

    import analysis.rundir as rundir
    load = rundir.load_pulses
    monkeypatch.setattr(rundir, "load_pulses", lambda d: {sw: [dataclasses.replace(pc, span=None) for pc in ps]
                                                          for sw, ps in load(d).items()})
    fault = replay_dir(RUN, DetectorConfig())["detection"]["per_fault"][0]
    assert not fault["localization_correct"] or fault["iterations_detect_to_localize"] > 2, fault


def test_span_priors_exist_for_every_spray_mode():
    """Every spray mode a fabric can run has its reference's noise prior (a mode added without one fails)."""
    assert set(SPAN_PRIOR_E) == set(SprayMode) and all(v > 0 for v in SPAN_PRIOR_E.values()) and SPAN_PRIOR_R > 0


def test_exported_verdict_files_give_the_same_span_evidence_as_the_detectors(tmp_path):
    """Agents in separate processes read each other's evidence from files (write_verdicts): a spine's on its
    links and a leaf's on its paths, with their reference, equal to what the detectors give in process."""
    from agent.detector import SwitchDetector
    from agent.incidents import LocalEvidence, VerdictFiles, write_verdicts
    from netns_testbed.topo import Link

    spec = ModelSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2), faults={"leaf1->spine2": 0.01}, seed=4)
    fab = Fabric(spec.fabric)
    dets = {sw: SwitchDetector(fab, sw, DetectorConfig(), SprayMode.RRDST) for sw in fab.switches}
    for sw, pulses in simulate(spec, 35, fault_from=30).items():
        for i, pc in enumerate(pulses):
            pc.start_time, pc.end_time = float(i), i + 0.5
            dets[sw].observe(pc)
    for det in dets.values():
        write_verdicts(tmp_path, det)
    files, local = VerdictFiles(tmp_path, max_age_s=3600), LocalEvidence(lambda: dets)
    link = Link("leaf1", "spine2")
    a, b = files.evidence("spine2", link, 30.0, 0.01), local.evidence("spine2", link, 30.0, 0.01)
    assert a == b and a.reference is Reference.SPAN and a.rate > 0.005
    path = "leaf1->spine2->leaf2"
    a, b = files.path("leaf2", path, 25.0), local.path("leaf2", path, 25.0)
    assert a == b and a.reference is Reference.SPAN and a.start == 30.0 and a.rate > 0.005
    # spine2's cell of leaf1's flows towards a leaf they go to, through its file as in process
    towards = [n.rsplit("->", 1)[1] for n, c in dets["spine2"].owner.owned_cells().items()
               if n.startswith("leaf1->spine2->") and c in dets["spine2"].owner.ledger.judged_cells()]
    assert towards
    a, b = files.evidence("spine2", link, 30.0, 0.01, towards[0]), local.evidence("spine2", link, 30.0, 0.01, towards[0])
    assert a == b and a.link == f"leaf1->spine2->{towards[0]}" and a.rate > 0.005
    # the file holds every link's cell and the judged others only
    doc = json.loads((tmp_path / "spine2.json").read_text())
    led = dets["spine2"].owner.ledger
    assert doc["ncells"] == len(doc["cells"]) < led.ncells == 4 + 16
    assert {n for n in doc["cells"] if n.count("->") == 1} == {f"leaf{a}->spine2" for a in range(4)}


@pytest.mark.parametrize("sizes, judged_by", [((1100,) + (600,) * 4, "leaf2->spine1"),
                                              ((1100,) * 5, "leaf2->spine1->leaf1")])
def test_a_cell_near_the_bound_settles_on_its_window_not_on_the_pulses_above_it(sizes, judged_by):
    """A 2% loss on leaf2->spine1 (counter model, 4x4x2); spine1's cell of leaf2's flows towards leaf1
    expects the given segments in each of the five faulty pulses (live: a mitigation's canary cut the
    uplink to a quarter of its share, and the cell hovered around the bound); spine1 has no alert of
    its own yet. leaf1's alert is settled upstream at once: on the whole port when the window's cells
    are small on average, on the cell when they are not.
    (Bounding each pulse instead judged the cell in the one pulse above it, and the alert waited for a
    second that never came: it paged as "localizing".)"""
    from agent.detector import SwitchDetector
    from agent.incidents import IncidentTracker, LocalEvidence

    spec = ModelSpec(fabric=FabricSpec(leaves=4, spines=4, hosts_per_leaf=2), faults={"leaf2->spine1": 0.02}, seed=2)
    fab = Fabric(spec.fabric)
    dets = {sw: SwitchDetector(fab, sw, DetectorConfig(), SprayMode.RRDST) for sw in fab.switches}
    faulty = iter(sizes)
    for sw, pulses in simulate(spec, 35, fault_from=30).items():
        for i, pc in enumerate(pulses):
            pc.start_time, pc.end_time = float(i), i + 0.5
            if sw == "spine1" and i >= 30:
                e = next(faulty)
                pc.span[2, 2] = sums(round(0.98 * e), 0, 0.25)
                pc.span[2, 2, SPAN] = e / 0.25 * MSS
            dets[sw].observe(pc)
    assert not dets["spine1"].owner.open_loss_links()
    alert = {"event": "alert", "alert_id": "leaf1/1/in/loss", "time": 34.6, "switch": "leaf1", "port": 1,
             "link": None, "candidates": ["spine1->leaf1", "leaf2->spine1"], "kind": "loss",
             "estimated_rate": 0.02, "onset_time": 30.0, "evidence": {"rate_sd": 0.004}}
    evs = IncidentTracker(fab, LocalEvidence(lambda: dets)).feed(alert)
    assert [e.get("link") for e in evs] == ["leaf2->spine1"], evs
    owner = evs[0]["evidence"]["owner_evidence"]
    assert owner["link"] == judged_by and owner["pulses"] == 5, owner
