"""The detector against streams with known truth.

Synthetic leaf streams (tests/synthetic.py) have exactly the detector's noise
model, so they test the statistics: the realised false-alarm rate against the
budget, and detection delays against the optimal CUSUM. Counter-model streams
(analysis/model.py: spraying, retransmissions, ACKs, every switch) test the
behaviour: onset anywhere, job changes, repair, restart, the learned model.
"""
from __future__ import annotations

import statistics

import json
import math

import numpy as np
import pytest

from agent.detector import DetectorConfig, Model, SwitchDetector
import agent.detector.checks as checks
from agent.detector.arl import arl_brook_evans, thresholds
from agent.detector.evidence import repair_ln_arl
from agent.detector.persistence import STATE_VERSION, ForeignState
from agent.detector.checks import peer_prior
from agent.pulse import PulseCounts
from analysis.model import FabricModel, ModelSpec
from netns_testbed.topo import Fabric, FabricSpec, SprayMode
from tests.synthetic import FABRIC, leaf_pulses, repair_run, run_lengths, unit_variance

MiB = 1 << 20
RR, RRDST, RANDOM = SprayMode.RR, SprayMode.RRDST, SprayMode.RANDOM


# -- statistics on synthetic streams ---------------------------------------------------------
@pytest.mark.parametrize("spray", [RANDOM, RR, RRDST])
def test_false_alarm_rate_matches_the_budget(spray):
    """A budget of 1e-3 false alarms per switch-pulse means an in-control run length of 1,000 pulses
    to the first false alert. Over 60 fresh detectors on healthy streams the mean run length is that
    budget's within [1/1.5, 2]: rate = 1 / mean in [alpha / 2, 1.5 alpha] (measured over 100 runs
    0.79-1.00 alpha, standard error 0.06-0.09: bench/false_alarms.py).

    The run length, not alert events per pulse: a false alert at these tiny shifts stays open for
    hundreds of pulses (its repair test needs that many), and no new alert on its port is raised
    meanwhile, so events per pulse read a rate well below the budget whatever the thresholds."""
    alpha, n, reps = 1e-3, 10_000, 60
    cfg = DetectorConfig(fa_per_day=alpha * 86400, switches=1, rotations=2)
    assert SwitchDetector(FABRIC, "leaf0", cfg, spray).alpha == pytest.approx(alpha)
    runs = run_lengths(spray, cfg, reps, n, seed=5, cap=20_000)
    rate = 1.0 / float(np.mean(runs))
    assert alpha / 2 <= rate <= 1.5 * alpha, (spray, rate / alpha)


@pytest.mark.parametrize("spray", [RANDOM, RR, RRDST])
def test_noise_factor_is_learned_unbiased(spray):
    """3,000 healthy pulses: the learned noise factor is the stream's true one within 4 standard
    errors of its estimate (``sqrt(2 / samples)``). A gate that read the CUSUMs after they took a
    pulse's deficits learned random spraying's factor 0.67 and round-robin's 6% low."""
    n = 10_000
    det = SwitchDetector(FABRIC, "leaf0", DetectorConfig(fa_per_day=1e-3 * 86400, switches=1, rotations=2), spray)
    for pc in leaf_pulses(spray, peer_prior(spray, n), n, 3000, np.random.default_rng(1)):
        det.observe(pc)
    noise = det.checks[0].noise
    k = int(np.argmax(noise.n))
    assert noise.n[k] > 1000
    truth = peer_prior(spray, n)
    assert noise.phis[k] == pytest.approx(truth, rel=4 * math.sqrt(2 / noise.n[k])), (noise.phis[k], noise.n[k])


@pytest.mark.parametrize("spray,n,p", [(RR, 10_000, 0.01), (RR, 10_000, 0.005), (RANDOM, 160_000, 0.01),
                                       (RANDOM, 160_000, 0.005), (RANDOM, 10_000, 0.015), (RRDST, 10_000, 0.0025)])
def test_delay_within_1_2_of_cusum_theory(spray, n, p):
    """Mean pulses to detect a loss p on one source's traffic through uplink 1, against theory.

    Theory: the optimal test for this one alternative, a CUSUM tuned to the true shift
    theta = p w (1 - w) n / sqrt(V) with known variance V, at the same per-switch false-alarm
    rate (threshold for ARL0 = cells / alpha). Its delay is the Brook-Evans zero-start ARL
    with x ~ N(theta, 1 + mu (1 - w) / V) (the loss itself adds binomial noise, mu = p w (1-w) n).
    The detector's bank over fixed magnitudes and the budget's split over it may cost up to 20%."""
    cfg = DetectorConfig(rotations=2)
    phi = peer_prior(spray, n)
    wq = 0.25 * 0.75
    var = phi * unit_variance(spray, n, 2)
    mu = p * wq * n
    theta = mu / math.sqrt(var)
    rng = np.random.default_rng(7)
    delays = []
    for _ in range(150):
        det = SwitchDetector(FABRIC, "leaf0", cfg, spray)
        for i, pc in enumerate(leaf_pulses(spray, phi, n, 2000, rng, fault=(1, p, 0))):
            if any(a.event == "alert" for a in det.observe(pc)):
                delays.append(i + 1)
                break
    assert len(delays) == 150
    h = float(thresholds(np.array([theta]), math.log(12) - math.log(det.alpha))[0])
    theory = arl_brook_evans(theta, h, shift=theta, sd=math.sqrt(1 + mu * 0.75 / var))
    # docs/results/detector.md's delay table: pytest -s -k delay_within tests/test_detector.py
    print(f"delay: {spray}, {n:,}, {p:.2%}: shift {theta:.2f} sd, measured {np.mean(delays):.2f}, "
          f"optimal {theory:.2f}, ratio {np.mean(delays) / theory:.2f}")
    assert np.mean(delays) <= 1.2 * theory, (np.mean(delays), theory)


# -- behaviour on counter-model streams ---------------------------------------------------------
def detectors(spec: ModelSpec, cfg: DetectorConfig | None = None, degraded=()) -> tuple[FabricModel, dict]:
    model = FabricModel(spec)
    fab = model.fabric
    oos = fab.parse_link_list(spec.out_of_service)
    deg = fab.parse_link_list(degraded)
    return model, {sw: SwitchDetector(fab, sw, cfg or DetectorConfig(), spec.spray, spec.weights, oos, deg)
                   for sw in fab.switches}


def step(model: FabricModel, dets: dict, i: int, events: list) -> None:
    for sw, pc in model.step().items():
        for a in dets[sw].observe(pc):
            events.append((i, a))


def run(spec: ModelSpec, pulses: int, onset: int, repair: int | None = None, cfg=None, degraded=()):
    """The spec's faults switch on before pulse ``onset`` (and off before ``repair``)."""
    model, dets = detectors(spec, cfg, degraded)
    model.set_faults({}, {})
    events: list = []
    for i in range(pulses):
        if i == onset:
            model.set_faults(spec.faults, spec.corrupt)
        if i == repair:
            model.set_faults({}, {})
        step(model, dets, i, events)
    return events, dets


def alerts(events, link=None):
    return [(i, a) for i, a in events if a.event == "alert" and (link is None or link in a.candidates)]


@pytest.mark.parametrize("onset", [0, 2, 200])
@pytest.mark.parametrize("link", ["spine1->leaf2", "leaf3->spine0"])
def test_rrdst_loss_caught_in_the_first_faulty_pulse_whatever_the_onset(onset, link):
    """Before the detectors' first pulse, during their first pulses, after 200 healthy ones."""
    spec = ModelSpec(spray="rrdst", seed=onset + 1, faults={link: 0.01})
    events, _ = run(spec, onset + 6, onset)
    hits = alerts(events, link)
    assert hits and hits[0][0] == onset, hits[:2]
    assert all(link in a.candidates for _, a in alerts(events)), [(i, a.switch, a.candidates) for i, a in events]


@pytest.mark.parametrize("onset", [0, 3, 120])
def test_corruption_caught_in_the_first_pulse_that_carries_it(onset):
    spec = ModelSpec(spray="rrdst", seed=2, corrupt={"leaf0->spine3": 0.015})
    events, _ = run(spec, onset + 4, onset)
    corr = [(i, a) for i, a in events if a.event == "alert" and a.kind == "corruption"]
    assert corr and corr[0][0] == onset
    assert corr[0][1].link == "leaf0->spine3" and corr[0][1].switch == "spine3"


@pytest.mark.parametrize("spray,size,rate,budget,at_start", [
    ("rrdst", 4 * MiB, 0.005, 2, 2), ("rr", 4 * MiB, 0.01, 3, 12), ("rr", 4 * MiB, 0.005, 10, 40),
    ("random", 64 * MiB, 0.01, 16, 16)])
@pytest.mark.parametrize("onset", [0, 150])
def test_targets_any_onset(spray, size, rate, budget, at_start, onset):
    """The issue's targets on the default fabric: caught within ``budget`` faulty pulses (the median of
    five runs; every run within ``at_start``, the bound before anything is learned).

    rr before anything was learned (onset 0) is bounded by its prior noise factor (5x the recorded
    one: theta 1.9 per pulse at 1%, CUSUM theory ~8 pulses; 0.97 at 0.5%, ~30): ``at_start``.
    Random spraying at 64 MiB, 1%: the optimal CUSUM at this budget (1 false alert a day for the
    8 switches at 1 pulse/s) needs 10.3 pulses on average (test_delay_within_1_2_of_cusum_theory
    measures the mean); one run (the model is slow at that size) is held to 16."""
    allowed = budget if onset else at_start
    delays = []
    for seed in ((11,) if size >= 64 * MiB else (11, 12, 13, 14, 15)):
        spec = ModelSpec(spray=spray, size=size, seed=seed, faults={"spine2->leaf1": rate})
        events, _ = run(spec, onset + at_start, onset)
        hits = alerts(events, "spine2->leaf1")
        assert hits, f"{spray} {rate} seed {seed} not caught within {at_start} pulses of onset {onset}"
        delays.append(hits[0][0] - onset + 1)
        assert not [a for i, a in alerts(events) if i < onset]
    assert statistics.median(delays) <= allowed, (spray, rate, onset, delays)


@pytest.mark.parametrize("delta", [0.5, 1.0, 2.0])
def test_a_loss_that_stays_keeps_its_alert_as_long_as_its_budget_says(delta):
    """The repair test's false-repair budget on streams with known truth. With a budget of one false
    repair per 300 pulses the mean run length to a false repair is at least that (the held rate's lower
    bound makes it longer than the table's 300). At the default budget (86,400 pulses) at most 1% of the
    alerts resolve during the 50 pulses of their loss (bench/repair.py --streams: 1 of 200 at 0.5 sd per
    pulse, none at 1 and 2; held at the estimate itself instead of its lower bound, 50 of 200 at 0.5 sd),
    and after the repair the alert resolves in a median of at most twice the table's ``h / (delta^2 /
    2)`` pulses at delta 1 and 2 (the bound's rate is below the loss's own; at 0.5 sd per pulse it
    takes a few times that: under 400 pulses)."""
    rng = np.random.default_rng(int(delta * 10))
    runs = [repair_run(rng, delta, math.log(300), None, 3000) or 3000 for _ in range(150)]
    assert np.mean(runs) >= 300, (delta, np.mean(runs), np.percentile(runs, [10, 50]))
    ln_day = repair_ln_arl(DetectorConfig().false_clears_per_day, DetectorConfig().pulse_hz)
    lags = [repair_run(rng, delta, ln_day, 50, 2000) for _ in range(150)]
    early = [x for x in lags if x is not None and x < 0]
    assert len(early) <= 0.01 * len(lags), sorted(early)
    h = float(thresholds(np.array([delta]), ln_day)[0])
    allowed = 400 if delta < 1 else 2 * h / (delta ** 2 / 2)
    assert np.median([2000 if x is None else x for x in lags]) <= allowed, (delta, np.median(lags), allowed)


def test_learning_is_not_poisoned_by_a_fault_present_from_the_start():
    """rr, 0.5% from the first pulse: the noise factor learned meanwhile stays near the healthy one."""
    spec = ModelSpec(spray="rr", seed=4, faults={"spine1->leaf2": 0.005})
    _, dets_h = run(ModelSpec(spray="rr", seed=4), 120, 999)
    events, dets_f = run(spec, 120, 0)
    assert alerts(events, "spine1->leaf2")
    phi_h = dets_h["leaf2"].checks[0].noise.phis
    phi_f = dets_f["leaf2"].checks[0].noise.phis
    assert phi_f.max() <= 1.5 * max(phi_h.max(), 1e-9), (phi_h, phi_f)


def test_job_changes_raise_nothing_and_a_fault_in_the_last_job_is_caught():
    """One set of detectors over successive jobs: sizes 1-64 MiB, 4 and 8 ranks (leaves going idle
    and coming back), every spray mode's noise; then a 1% loss in the last job."""
    cfg = DetectorConfig()
    fab = Fabric(FabricSpec())
    dets = {sw: SwitchDetector(fab, sw, cfg, "rrdst") for sw in fab.switches}
    events: list = []
    jobs = [(4 * MiB, 8), (16 * MiB, 8), (1 * MiB, 4), (64 * MiB, 8), (2 * MiB, 2), (4 * MiB, 6), (4 * MiB, 8)]
    i = 0
    for j, (size, ranks) in enumerate(jobs):
        last = j == len(jobs) - 1
        model = FabricModel(ModelSpec(spray="rrdst", size=size, ranks=ranks, seed=j))
        for k in range(40):
            if last and k == 20:
                model.set_faults({"leaf1->spine3": 0.01})
            step(model, dets, i, events)
            i += 1
    onset = i - 20
    false = [(n, a.switch, a.candidates) for n, a in alerts(events) if n < onset]
    assert false == []
    hits = alerts(events, "leaf1->spine3")
    assert hits and hits[0][0] == onset


@pytest.mark.parametrize("spray,kind", [("rrdst", "drop"), ("rr", "drop"), ("rrdst", "corrupt")])
def test_alert_resolves_soon_after_the_repair(spray, kind):
    """Every alert resolves after the repair, none before it; the leaves' within 10 pulses. The spine's
    loss alert of the corruption (its damaged frames are dropped) carries 1.1 sd per pulse at its held
    rate, and the repair test's budget (one false repair a day: 9.6 nats there) asks about 15 pulses of
    it (10 in this run); it has 20."""
    faults = {"spine1->leaf2": 0.01} if kind == "drop" else {}
    corrupt = {"leaf2->spine1": 0.015} if kind == "corrupt" else {}
    spec = ModelSpec(spray=spray, seed=5, faults=faults, corrupt=corrupt)
    events, dets = run(spec, 100, 20, repair=60)
    opened = {a.alert_id for _, a in alerts(events)}
    resolved = {a.alert_id: i for i, a in events if a.event == "resolved"}
    assert opened and set(resolved) == opened
    assert all(60 <= i < (70 if aid.startswith("leaf") else 80) for aid, i in resolved.items()), resolved
    assert all(not d.active for d in dets.values())


def test_a_restarted_detector_continues_from_its_saved_state():
    """Random spraying at 64 MiB needs several pulses of evidence: a detector restarted in the
    middle (state saved, JSON round trip, loaded) alerts when the uninterrupted one does."""
    spec = ModelSpec(spray="random", size=64 * MiB, seed=3, faults={"spine0->leaf1": 0.01})
    model = FabricModel(spec)
    pulses = [model.step()["leaf1"] for _ in range(40)]
    cfg = DetectorConfig()

    def first_alert(det, seq, start):
        for i, pc in enumerate(seq, start):
            if any(a.event == "alert" for a in det.observe(pc)):
                return i
        return None

    whole = first_alert(SwitchDetector(model.fabric, "leaf1", cfg, "random"), pulses, 0)
    assert whole is not None and whole > 3
    first = SwitchDetector(model.fabric, "leaf1", cfg, "random")
    assert first_alert(first, pulses[:3], 0) is None
    saved = json.loads(json.dumps(first.state()))
    second = SwitchDetector(model.fabric, "leaf1", cfg, "random")
    second.load_state(saved)
    assert first_alert(second, pulses[3:], 3) == whole
    with pytest.raises(ForeignState):
        SwitchDetector(model.fabric, "leaf2", cfg, "random").load_state(saved)
    older = {**saved, "identity": {**saved["identity"], "version": STATE_VERSION - 1}}
    with pytest.raises(ForeignState):     # another version's layout: started afresh, not called damaged
        SwitchDetector(model.fabric, "leaf1", cfg, "random").load_state(older)


def test_learned_model_reports_asymmetry_present_at_start_then_catches_a_new_fault():
    """Weights the detector is not told make the start asymmetric: the learned model says so (one
    'asymmetry' alert), then judges against what it measured and still catches a new loss."""
    spec = ModelSpec(spray="rrdst", seed=8, weights={"leaf1->spine0": 2.0}, faults={"spine2->leaf2": 0.01})
    model = FabricModel(spec)
    model.set_faults({})                      # the loss starts at pulse 40
    det = SwitchDetector(model.fabric, "leaf2", DetectorConfig(model=Model.LEARNED), "rrdst")
    events = []
    for i in range(60):
        if i == 40:
            model.set_faults(spec.faults)
        events += [(i, a) for a in det.observe(model.step()["leaf2"]) if a.event == "alert"]
    asym = [a for _, a in events if a.kind == "asymmetry"]
    assert asym and {a.port for a in asym} <= {1, 2, 3} and all(i < 40 for i, a in events if a.kind == "asymmetry")
    loss = [(i, a) for i, a in events if a.kind == "loss"]
    assert loss and loss[0][0] == 40 and loss[0][1].port == 2


def test_known_out_of_service_is_silent_and_new_fault_caught():
    spec = ModelSpec(spray="rrdst", seed=4, out_of_service=["leaf1<->spine2"], faults={"spine0->leaf3": 0.01})
    events, _ = run(spec, 60, 30)
    hits = alerts(events)
    assert hits and hits[0][0] == 30
    assert all("spine0->leaf3" in a.candidates for _, a in hits), [(a.switch, a.candidates) for _, a in hits]


def test_declared_degraded_link_not_tested():
    spec = ModelSpec(spray="rrdst", seed=6, faults={"spine1->leaf2": 0.02})
    events, _ = run(spec, 40, 0, degraded=["spine1->leaf2"])
    assert [a for _, a in events if "spine1->leaf2" in a.candidates] == []


def test_noise_pulses_ignored_and_one_alert_per_fault():
    model, dets = detectors(ModelSpec(seed=9))
    det = dets["leaf2"]
    noise = PulseCounts("leaf2", 0, np.zeros((6, 2, 6), np.int64), np.zeros((6, 2), np.int64))
    noise.ip[0, 0, 0] = 3  # a few pings
    events = []
    for i in range(60):
        if i == 15:
            model.set_faults({"spine3->leaf2": 0.05})
        events += det.observe(model.step()["leaf2"])
        events += det.observe(noise)
    assert sum(1 for a in events if a.event == "alert") == 1
    assert det.pulses_used == 60


def test_pulse_shape_mismatch_is_an_error():
    det = SwitchDetector(Fabric(FabricSpec()), "leaf0", DetectorConfig())
    with pytest.raises(ValueError, match="ports"):
        det.observe(PulseCounts("leaf0", 1, np.zeros((3, 2, 6), np.int64), np.zeros((3, 2), np.int64)))


def test_bad_config():
    from netns_testbed.errors import SpecError

    for kw in (dict(model="magic"), dict(fa_per_day=0), dict(fa_per_day=float("nan")), dict(pulse_hz=-1),
               dict(magnitudes=()), dict(magnitudes=(0.01, 1.5)), dict(quiet_level=1.0), dict(certify_lag=0),
               dict(switches=0), dict(min_rate=float("inf"))):
        with pytest.raises(SpecError):
            DetectorConfig(**kw).validate()
    with pytest.raises(SpecError, match="unknown detector setting"):
        DetectorConfig.from_dict({"alpha": 1e-6})


def test_budget_is_stated_per_fabric_and_day():
    cfg = DetectorConfig(fa_per_day=1.0, pulse_hz=2.0)
    assert cfg.alpha(8) == pytest.approx(1 / (86400 * 2 * 8))
    assert DetectorConfig(switches=96).alpha(8) == pytest.approx(1 / (86400 * 96))


def two_host_pulses(rng, pulses: int, fabric_loss_from: int | None, host_surplus: float, overshoot: float = 0.0):
    """leaf0 of 4x4x2: leaves 1..3 send n packets each per pulse over 4 uplinks (random spray), half to h0 and
    half to h1. ``fabric_loss_from``: pulse from which 2% of leaf 1's packets through spine1 are lost, resent
    over all uplinks, and ``overshoot`` times as many again resent spuriously to h1. ``host_surplus``: h1
    receives this share more than h0 in every pulse from pulse 20 (a lossy leaf0->h1: resends)."""
    n, out = 200_000, []
    for t in range(pulses):
        ip = np.zeros((6, 2, 6))
        for src in (2, 3, 4):
            c = rng.multinomial(n, [0.25] * 4).astype(float)
            spurious = 0.0
            if fabric_loss_from is not None and t >= fabric_loss_from and src == 2:
                lost = rng.binomial(int(c[1]), 0.02)
                spurious = lost * overshoot
                c[1] -= lost
                c += (lost + spurious) / 4
            regular = c.sum() - spurious
            h0, h1 = regular / 2, regular / 2 + spurious
            if t >= 20 and host_surplus:
                extra = host_surplus * h1
                c += extra / 4
                h1 += extra
            ip[:4, 0, src] = c
            ip[4, 1, src], ip[5, 1, src] = h0, h1
        out.append(PulseCounts("leaf0", t + 1, ip, np.zeros((6, 2)), start_time=float(t), end_time=t + 0.5))
    return out


def test_host_ports_wait_while_a_fabric_loss_into_the_leaf_is_open():
    """Spurious retransmissions after a fabric loss overshoot what the peer test takes off the hosts behind
    it (live, reduce_scatter with two 2% drops: two healthy host links got a surplus alert). While the
    peer test's alert is open the host ports are not judged; a host link's own loss is still found alone."""
    rng = np.random.default_rng(5)
    cfg = DetectorConfig()
    det = SwitchDetector(FABRIC, "leaf0", cfg, RANDOM)
    events = [e for pc in two_host_pulses(rng, 80, fabric_loss_from=20, host_surplus=0.0, overshoot=2.0)
              for e in det.observe(pc)]
    tests = {(e.event, e.evidence.get("test")) for e in events}
    assert ("alert", "peer") in tests and ("alert", "host") not in tests, events
    det = SwitchDetector(FABRIC, "leaf0", cfg, RANDOM)
    events = [e for pc in two_host_pulses(rng, 80, fabric_loss_from=None, host_surplus=0.02) for e in det.observe(pc)]
    hosts = [e for e in events if e.event == "alert" and e.evidence.get("test") == "host"]
    assert hosts and hosts[0].candidates[0] == "leaf0->h1" and {e.evidence.get("test") for e in events} == {"host"}


def tail_stall_pulses(rng, pulses: int, stall_p: float = 0.0, host_surplus: float = 0.0,
                      stalls: dict[int, tuple[float, float]] | None = None):
    """leaf0 of 4x4x2 under a ring job: each host gets 10,000 packets a pulse from leaves 1..3 (random
    spray). A stall moves the tail of one host's iteration to the next pulse (longer than the pulse gap:
    the assembler folds it into the next iteration's pulse): with probability ``stall_p`` per pulse, 1-8%
    of a random host's packets, and at the pulses ``stalls`` names ``{pulse: (share of h0, share of h1)}``.
    ``host_surplus``: from pulse 20, h1 also gets that share again (a lossy leaf0->h1: resends)."""
    n, late, out = 10_000, np.zeros(2), []
    for t in range(pulses):
        to_host = n + late
        late = np.zeros(2)
        if stalls and t in stalls:
            late = np.floor(np.array(stalls[t]) * n)
        elif rng.random() < stall_p:
            h = rng.integers(2)
            late[h] = np.floor(rng.uniform(0.01, 0.08) * n)
        to_host -= late
        if host_surplus and t >= 20:
            to_host[1] += rng.binomial(n, host_surplus)
        out.append(leaf0_pulse(rng, t, to_host))
    return out


def leaf0_pulse(rng, t: int, to_host) -> PulseCounts:
    """leaf0 of 4x4x2's pulse ``t + 1``: ``to_host[h]`` packets to each host, a third from each other
    leaf, each sprayed evenly over the four uplinks (random spray)."""
    ip = np.zeros((6, 2, 6))
    for h in range(2):
        per_src = rng.multinomial(int(to_host[h]), [1 / 3] * 3)
        for i, src in enumerate((2, 3, 4)):
            ip[4 + h, 1, src] = per_src[i]
            ip[:4, 0, src] += rng.multinomial(per_src[i], [0.25] * 4)
    return PulseCounts("leaf0", t + 1, ip, np.zeros((6, 2)), start_time=float(t), end_time=t + 0.5)


TAIL_RULES_OFF = {"HOST_REPAYS": False, "HOST_OWED_ALONE": False, "HOST_SHORT": math.inf,
                  "HOST_SHORT_AFTER": 3,   # HOST_SHORT_AFTER: back to the three pulses of history it needed
                  "HOST_LONG": False}


def tail_rules_off(monkeypatch, rules) -> None:
    """Turn off the host test's tail rules named (keys of TAIL_RULES_OFF) for one test."""
    for rule in rules:
        monkeypatch.setattr(checks, rule, TAIL_RULES_OFF[rule])


def host_alerts(pulses) -> list:
    det = SwitchDetector(FABRIC, "leaf0", DetectorConfig(), RANDOM)
    return [(pc.pulse, e) for pc in pulses for e in det.observe(pc) if e.event == "alert"]


# Stalls that move iteration tails to the next pulse, as seen live (shares of each host's packets moved):
TAILS = {
    # CI, ddp (tests/data/recorded-runs/ci-ddp-host-tail-stall): 359 packets to h6 came 160 ms after the
    # rest of their iteration, two pulses later h7's 716 did the same: h6 above its peer twice running
    "one host's tail, then its peer's": {60: (0.036, 0.0), 62: (0.0, 0.072)},
    # a fresh clone, allreduce (clone-host-short-iterations): h6 short by 1,094 and h7 by 323, then the
    # next iteration's tail and head misaligned: h7 above its peer twice running, a false 8% alert
    "two short iterations": {60: (0.107, 0.036), 61: (0.32, 0.18)},
    # a long tail that comes back in two parts: two surpluses running
    "a tail that comes back in two parts": {60: (0.1, 0.0), 61: (0.05, 0.0)},
}


def test_iteration_tails_moved_to_the_next_pulse_raise_no_host_alert():
    """A stall longer than the pulse gap moves the tail of an iteration into the next iteration's pulse
    (the assembler folds small pulses forward). Two rules keep that from reading as a lossy host link: a
    surplus first repays the host's shortfall of the pulse before (HOST_REPAYS), and hosts are not judged
    in a pulse that is short of the recent ones (HOST_SHORT). Neither matters to a real loss, which only
    adds packets (next test). Also: tails in a tenth of 1,000 pulses at random (live: 2-15% of a leaf's
    pulses move a host by more than 1%) raise nothing."""
    for name, stalls in TAILS.items():
        assert host_alerts(tail_stall_pulses(np.random.default_rng(11), 100, stalls=stalls)) == [], name
    assert host_alerts(tail_stall_pulses(np.random.default_rng(3), 1000, stall_p=0.1)) == []


@pytest.mark.parametrize("off, case, named", [
    (("HOST_REPAYS", "HOST_SHORT"), "one host's tail, then its peer's", "leaf0->h0"),
    (("HOST_SHORT",), "two short iterations", "leaf0->h1"),
    (("HOST_REPAYS",), "a tail that comes back in two parts", "leaf0->h0")])
def test_without_the_tail_rules_tails_raise_host_alerts(monkeypatch, off, case, named):
    """The controls: each pattern alarms with the rule(s) that stop it turned off (so each is needed)."""
    tail_rules_off(monkeypatch, off)
    alerts = host_alerts(tail_stall_pulses(np.random.default_rng(11), 100, stalls=TAILS[case]))
    assert [e.candidates[0] for _, e in alerts] == [named], alerts


# A job's first pulses, per-host packets as a fresh clone's live runs had them (leaf0 of allreduce,
# leaf1 of ddp; tests/data/recorded-runs/clone-*-host-*), then iterations of 10,000 a host:
HEADS = {
    # allreduce: iteration 3 cut at its phase boundary (4,017/4,388 then 6,204/5,970: the halves are not
    # even per host) with two pulses of history; h1 above h0 twice running raised a false 2.9% alert
    "an iteration split in the first pulses": [(14, 0), (578, 58), (9832, 10199), (4017, 4388), (6204, 5970)],
    # ddp: 237 packets of an iteration's head reached h2 alone, in a pulse of their own; h3 then stood
    # 237 above h2 and 539 in the pulse after: a false 4.3% alert
    "a head alone in its pulse": [(31, 30), (4, 2), (42, 42), (237, 0), (5483, 5720), (8642, 9181), (1439, 899)],
}


def job_start_pulses(rng, start: list[tuple[int, int]], pulses: int = 60) -> list[PulseCounts]:
    return [leaf0_pulse(rng, t, np.array(start[t] if t < len(start) else (10_000, 10_000), dtype=float))
            for t in range(pulses)]


def test_a_jobs_uneven_first_pulses_raise_no_host_alert():
    """The short-pulse rule holds from the first pulse with a history (HOST_SHORT_AFTER), and a host that
    got nothing while its peer got a pulse alone is owed it (HOST_OWED_ALONE). Either stops the split
    iteration (10 seeds); the head alone needs the second (9 of 10 seeds alarm without it)."""
    for name, start in HEADS.items():
        for seed in range(5):
            assert host_alerts(job_start_pulses(np.random.default_rng(seed), start)) == [], (name, seed)


@pytest.mark.parametrize("off, case", [
    (("HOST_SHORT_AFTER", "HOST_OWED_ALONE"), "an iteration split in the first pulses"),
    (("HOST_OWED_ALONE", "HOST_LONG"), "a head alone in its pulse")])
def test_without_the_job_start_rules_the_first_pulses_raise_a_host_alert(monkeypatch, off, case):
    tail_rules_off(monkeypatch, off)
    alerts = host_alerts(job_start_pulses(np.random.default_rng(0), HEADS[case]))
    assert [e.candidates[0] for _, e in alerts] == ["leaf0->h1"], alerts


def test_a_lossy_host_link_is_still_found_among_iteration_tails():
    """A 2% leaf0->h1 loss with tails moving between pulses in a tenth of them, 20 seeds: always named, in
    the 3rd faulty pulse in the median, the 17th at worst (before the job-start rules: 3.5 and 17;
    repaying only: 4 and 13; neither rule: 3.5 and 13; without tails: the 3rd in every seed, as the host
    test judges a pulse once the next one confirms it). Over 40 seeds: median 3, 38 of 40 within 10."""
    delays = []
    for seed in range(20):
        alerts = host_alerts(tail_stall_pulses(np.random.default_rng(seed), 80, stall_p=0.1, host_surplus=0.02))
        assert alerts, seed
        pulse, alert = alerts[0]
        assert alert.evidence.get("test") == "host" and alert.candidates[0] == "leaf0->h1", alert
        delays.append(pulse - 20)
    assert statistics.median(delays) <= 4 and max(delays) <= 20, delays


def test_a_detector_with_an_open_asymmetry_alert_saves_and_loads_its_state():
    """Learned shares that contradict the model open an asymmetry alert; its state is saved like any other
    (it held a float where its repair test belongs, and saving failed with an AttributeError)."""
    import json

    from agent.detector import Model

    spec = ModelSpec(seed=1, weights={"leaf1->spine2": 3.0})    # the detectors are not told of the weight
    model = FabricModel(spec)
    cfg = DetectorConfig(model=Model.LEARNED)
    dets = {sw: SwitchDetector(model.fabric, sw, cfg, spec.spray) for sw in model.fabric.switches}
    for i in range(20):
        for sw, pc in model.step().items():
            pc.start_time, pc.end_time = float(i), i + 0.5
            dets[sw].observe(pc)
    open_asym = [d for d in dets.values() if any(oa.alert.kind == "asymmetry" for oa in d.active.values())]
    assert open_asym
    for d in open_asym:
        saved = json.loads(json.dumps(d.state()))
        again = SwitchDetector(model.fabric, d.switch, cfg, spec.spray)
        again.load_state(saved)
        assert set(again.active) == set(d.active)
