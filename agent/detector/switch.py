"""The detector of one switch: its checks, their evidence, the alert book.

Uses only this switch's per-pulse counts plus static configuration (the
fabric model, spray mode and weights, links known to be out of service or
degraded). ``observe(PulseCounts) -> [Alert]`` is the whole contract: the
live agent, the replay, the recorded traces and the scale model all call it.

Per pulse:

1. every check makes its samples (deficit, variance form, signal per unit of
   loss rate) over its cells;
2. the budget gives each CUSUM its ARL: ``ln ARL0 = ln(n_cusums / alpha)``
   with ``alpha`` the switch's per-pulse share of the fabric's daily false
   alerts (:mod:`agent.detector.config`), counting only the CUSUMs that can
   false-alarm at that rate at all (:func:`agent.detector.arl.budget_ln_arl`);
3. each bank updates (:mod:`agent.detector.evidence`); cells over threshold
   become alerts, grouped per port;
4. open alerts run their reverse test and resolve when repaired;
5. a pulse in which every CUSUM stayed below ``quiet_level`` of its threshold
   and no alert was open goes into a queue; once ``certify_lag`` more such
   pulses followed, it is certified healthy and its samples refine the noise
   factor (and the learned shares). Anything loud empties the queue.

Nothing waits for a warm-up: the analytic model judges from the first pulse
with the spray mode's theoretical noise.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.special import ndtri

from agent.detector.alerts import Alert, AlertBook, OpenAlert
from agent.detector.arl import budget_ln_arl
from agent.detector.checks import (CorruptionCheck, HostCheck, PeerCheck, Samples, SpineCheck, Suspect,
                                   TotalsPeerCheck, path_name)
from agent.detector.config import DetectorConfig, Model
from agent.detector.evidence import CusumBank, Judgement, PoissonCusum, repair_ln_arl, reverse_llr_poisson
from agent.detector.verdict import Ledger, LinkEvidence, Span, evidence_from, path_evidence
from agent.pulse import PulseAssembler, PulseCounts
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, Link, SprayMode, node_kind

STATE_VERSION = 5   # 4: verdict ledgers from sequence spans when the counts carry them (a spine's, a leaf's paths)
                    # 5: the links out of service beside the identity, not in it (a drain keeps what was learned)
# Host ports are not judged while a fabric loss into the leaf shows (see observe); a switch for the
# recorded-run tests that show what each rule fixes
HOSTS_WAIT_FOR_FABRIC_LOSS = True
# Packets sprayed just before a spray change can be counted after it (queued in a veth's backlog, on
# another CPU, in a host's socket): a pulse this close to the change's window is not judged either.
RESHARE_SETTLE_NS = 5_000_000
STATE_SCHEMA = Path(__file__).with_name("state.schema.json")   # the saved state's top level (SwitchDetector.state)


class ForeignState(ValueError):
    """A saved detector state of another switch, fabric state or configuration: not bad, not this one's."""


class SwitchDetector:
    """Feed it :class:`PulseCounts` of one switch; it returns alert events."""

    def __init__(self, fabric: Fabric, switch: str, cfg: DetectorConfig | None = None,
                 spray: SprayMode | str = SprayMode.RRDST, weights: dict[str, float] | None = None,
                 out_of_service: list[Link] | None = None, degraded: list[Link] | None = None,
                 per_source: bool = True) -> None:
        """``per_source``: the counts split packets by source leaf (the eBPF counters, recorded runs, the
        model). Without the split (interface statistics) leaves judge their uplinks' totals
        (:class:`TotalsPeerCheck`), not their host links, and spines only damaged frames."""
        self.fabric = fabric
        self.per_source = per_source
        self.switch = switch
        self.cfg = (cfg or DetectorConfig()).validate()
        self.spray = SprayMode.parse(spray)
        self.weights = dict(weights or {})
        self.oos = list(out_of_service or [])
        deg = {l.name for l in degraded or []}
        self.is_leaf = node_kind(switch) == "leaf"
        self.nports = len(fabric.ports[switch])
        args = (fabric, switch, self.spray, self.cfg, self.weights, self.oos, deg)
        peer = PeerCheck if per_source else TotalsPeerCheck
        self.checks: list[PeerCheck | SpineCheck | HostCheck] = [peer(*args)] if self.is_leaf else \
            [SpineCheck(*args)] if self.cfg.spine_test and per_source else []
        # The host test needs the eBPF counters: their D-SACK counts take spurious resends off (interface
        # statistics have none, and a healthy job's resend bursts then read as a host-link loss: a
        # netlink agent raised one in a fresh clone's 100 healthy iterations), and their split by source
        # tells which hosts a fabric loss reaches.
        if self.is_leaf and self.cfg.host_test and per_source and fabric.spec.hosts_per_leaf >= 2:
            self.checks.append(HostCheck(fabric, switch, self.cfg, deg, self.checks[0]))
        self.banks = [CusumBank(self.cfg.magnitudes, c.shape) for c in self.checks]
        self.corruption = CorruptionCheck(fabric, switch, deg)
        self.poisson = PoissonCusum(self.cfg.corruption_background, self.cfg.corruption_rate, self.nports)
        self.alpha = self.cfg.alpha(len(fabric.switches))
        self.book = AlertBook(self.cfg.update_every)
        self.assembler = PulseAssembler(self.cfg.fragment_share, self.cfg.min_pulse_pkts)
        self.pending: deque[tuple[int, list]] = deque()
        self.pulses_used = 0
        self.last_scores: dict[int, float] = {}
        self.last_ln_arl = 0.0
        # spray changes not yet reached (reshare): links out of service, weights, the window's ends
        self.changes: deque[tuple[list[Link], dict[str, float], float, float]] = deque()
        self.skipped = 0                                 # pulses not judged because a change crossed them

    # -- a change of the spray shares (a drain, a restore, an uplink's weight) --------
    def reshare(self, out_of_service: Sequence[Link], t0_ns: int = 0, t1_ns: int | None = None,
                weights: dict[str, float] | None = None) -> None:
        """The leaves spray with ``out_of_service`` out of service (and uplink ``weights``, None: as they
        are) since the change between monotonic times ``t0_ns`` and ``t1_ns`` (None: still changing).
        Everything learned stays
        (noise factors, CUSUMs, ledgers, open alerts: a drained link's cells just stop being judged, its
        open alerts stay open). Pulses are judged by the shares of their time, also when they are read
        late: one that ends before the change by the old ones, one that starts after it by the new ones,
        and one that overlaps it (widened by :data:`RESHARE_SETTLE_NS` each side) holds packets sprayed
        both ways and is not judged. The same change told again with its end known replaces itself."""
        lo = t0_ns - RESHARE_SETTLE_NS
        hi = math.inf if t1_ns is None else t1_ns + RESHARE_SETTLE_NS
        if self.changes and self.changes[-1][1] == lo:
            self.changes.pop()
        self.changes.append((list(out_of_service), dict(self.weights if weights is None else weights), lo, hi))

    def _shares_for(self, pc: PulseCounts) -> bool:
        """Bring the checks' shares to the pulse's time; False if a change crosses the pulse."""
        while self.changes:
            oos, weights, lo, hi = self.changes[0]
            if pc.end_ns > 0 and pc.end_ns < lo:
                return True                  # sprayed before the change
            if pc.end_ns > 0 and pc.start_ns <= hi:
                return False                 # sprayed both ways
            self._set_out_of_service(oos, weights)   # after it (or a pulse with no kernel times: a replay)
            self.changes.popleft()
        return True

    def _set_out_of_service(self, oos: list[Link], weights: dict[str, float] | None = None) -> None:
        self.oos = list(oos)
        if weights is not None:
            self.weights = dict(weights)
        for chk in self.checks:
            chk.set_shares(self.weights, self.oos)

    # -- the per-pulse step ----------------------------------------------------------
    def observe(self, pc: PulseCounts) -> list[Alert]:
        if pc.nports != self.nports:
            raise ValueError(f"{self.switch}: pulse has {pc.nports} ports, the fabric model {self.nports}")
        pc = self.assembler.push(pc)
        if pc is None or pc.total < self.cfg.min_pulse_pkts:
            return []
        if not self._shares_for(pc):
            for chk in self.checks:
                chk.forget_held()
            self.pending.clear()
            self.skipped += 1
            return []
        t = self.pulses_used
        self.pulses_used += 1
        smps = [c.samples(pc) for c in self.checks]
        vs = [c.noise.variance(s.u, s.cls) for c, s in zip(self.checks, smps)]
        bad, frames, cmask = self.corruption.counts(pc)
        shifts = [b.shifts(s.s, v)[:, s.mask] for b, s, v in zip(self.banks, smps, vs)]
        flat = np.concatenate(shifts, axis=1) if shifts else np.zeros((0,))
        ln_arl = budget_ln_arl(flat, math.log(self.alpha), extra=int(cmask.sum()))
        self.last_ln_arl = ln_arl
        judged: list[tuple[Samples, np.ndarray, Judgement]] = []
        fabric_loss = HOSTS_WAIT_FOR_FABRIC_LOSS and self._fabric_loss_open()
        for chk, bank, smp, v in zip(self.checks, self.banks, smps, vs):
            if chk.kind == "host" and fabric_loss:
                # A fabric loss into this leaf is open or alarming now (its peer test runs first): the
                # senders' retransmissions, spurious ones included, reach the hosts behind it and
                # overshoot what the peer test takes off (live: two 2% drops under reduce_scatter gave
                # two healthy host links a surplus alert). Host ports are not judged until it clears;
                # a host link's own loss waits for that. (The budget above counted these cells: stricter.)
                smp.mask = np.zeros_like(smp.mask)
            when = pc.start_time if smp.start_time is None else smp.start_time
            j = bank.update(smp.r, v, smp.s, smp.mask, t, when, ln_arl)
            fabric_loss = fabric_loss or (HOSTS_WAIT_FOR_FABRIC_LOSS and chk.kind == "peer" and bool(j.alarm.any()))
            judged.append((smp, v, j))
        cj = self.poisson.update(bad, frames, cmask, t, pc.start_time, ln_arl)
        events = self._findings(pc)
        events += self._alarms(pc, judged, cj)
        events += self._reverse(pc, judged, (bad, frames, cmask))
        self._scores(judged, cj)
        self._certify(t, judged)
        return events

    def _fabric_loss_open(self) -> bool:
        """A loss alert of this leaf's peer test is open (a fabric link into it is lossy)."""
        return self.is_leaf and any(oa.alert.kind == "loss" and (oa.alert.evidence or {}).get("test") == "peer"
                                    for oa in self.book.open.values())

    # -- alarms -> alerts --------------------------------------------------------------
    def _alarms(self, pc: PulseCounts, judged, cj: Judgement) -> list[Alert]:
        hits: dict[str, list[tuple[int, tuple, float]]] = {}
        for i, (smp, _, j) in enumerate(judged):
            for idx in zip(*np.nonzero(j.alarm)):
                idx = tuple(int(x) for x in idx)
                rate = self.banks[i].estimate(idx)[0]
                if rate < self.cfg.min_rate:
                    continue
                sus = self.checks[i].suspects(idx)
                hits.setdefault(self._aid(sus, "loss"), []).append((i, idx, float(j.score()[idx])))
        for p in np.flatnonzero(cj.alarm):
            sus = self.corruption.suspects((int(p),))
            hits.setdefault(self._aid(sus, "corruption"), []).append((-1, (int(p),), float(cj.ratio[0, p])))
        events = []
        for aid, found in hits.items():
            ci, idx, score = max(found, key=lambda c: c[2])
            cells = {(c[0], c[1]) for c in found}
            alert = self._make_alert(pc, aid, ci, idx, score, cells)
            ev = self.book.publish(alert, cells, pc.pulse)
            if ev is not None:
                events.append(ev)
        return events

    def _aid(self, sus: Suspect, kind: str) -> str:
        return f"{self.switch}/{sus.port}/{sus.direction}/{kind}"

    def _make_alert(self, pc: PulseCounts, aid: str, ci: int, idx: tuple, score: float,
                    cells: set[tuple[int, tuple]]) -> Alert:
        if ci < 0:
            rate, ci95, onset, onset_time, deficit = self.poisson.estimate(idx[0])
            sus, kind, test = self.corruption.suspects(idx), "corruption", "corruption"
            per_rate = None
        else:
            rate, ci95, onset, onset_time, deficit = self.banks[ci].estimate(idx)
            chk = self.checks[ci]
            sus, kind, test = chk.suspects(idx), "loss", chk.kind
            j = self.banks[ci].best(idx)
            per_rate = float(self.banks[ci].sum_s[(j,) + idx])
        link, cands = sus.link, list(sus.candidates)
        prev = self.book.open.get(aid)
        suspects = [self.checks[c].suspects(x) for c, x in cells | (prev.cells if prev else set()) if c >= 0]
        if link is None and len({s.source for s in suspects}) >= 2:
            # deficits from two or more sources through one port: only the common link explains them
            common = set(cands).intersection(*(s.candidates for s in suspects))
            if len(common) == 1:
                link = next(iter(common))
                cands = [link]
        port = self.fabric.port(self.switch, sus.port)
        return Alert("alert", aid, pc.end_time, self.switch, sus.port, port.ifname, sus.direction,
                     link.name if link else None, [c.name for c in cands], kind, round(rate, 6),
                     [round(ci95[0], 6), round(ci95[1], 6)], round(score, 3), self.pulses_used - onset, pc.pulse,
                     pc.start_time, onset, onset_time,
                     {"test": test, "source": sus.source, "deficit": round(deficit, 1),
                      "deficit_per_unit_rate": None if per_rate is None else round(per_rate, 1),
                      "rate_sd": round((ci95[1] - rate) / 1.96, 6),
                      "window_start": onset_time, "ln_arl": round(self.last_ln_arl, 3)})

    def _findings(self, pc: PulseCounts) -> list[Alert]:
        """Learned model: shares measured at start that contradict the analytic model."""
        events = []
        for ci, chk in enumerate(self.checks):
            found = getattr(chk, "findings", None)
            if not found:
                continue
            ncells = max(1, int(np.sum(chk.usable)))
            z_star = float(-ndtri(self.alpha / ncells))
            for idx, rate, z in found:
                if z <= z_star or rate < self.cfg.min_rate:
                    continue
                sus = chk.suspects(idx)
                aid = self._aid(sus, "asymmetry")
                port = self.fabric.port(self.switch, sus.port)
                alert = Alert("alert", aid, pc.end_time, self.switch, sus.port, port.ifname, sus.direction, None,
                              [c.name for c in sus.candidates], "asymmetry", round(rate, 6), [0.0, 0.0],
                              round(z / z_star, 3), self.cfg.learn_pulses, pc.pulse, pc.start_time,
                              self.pulses_used - self.cfg.learn_pulses, pc.start_time,
                              {"test": "learned-vs-analytic shares", "source": sus.source, "z": round(z, 2),
                               "z_threshold": round(z_star, 2)})
                if aid not in self.book.open:
                    self.book.open[aid] = OpenAlert(alert, set(), 0.0, pc.pulse)
                    events.append(alert)
            found.clear()
        return events

    # -- repair ------------------------------------------------------------------------
    def _reverse(self, pc: PulseCounts, judged, corr) -> list[Alert]:
        """Every open alert's repair test (:class:`agent.detector.evidence.Repair`)."""
        bad, frames, cmask = corr
        events = []
        floor = math.log(self.cfg.clear_lr)
        ln_a = repair_ln_arl(self.cfg.false_clears_per_day, self.cfg.pulse_hz)
        for aid, oa in list(self.book.open.items()):
            if oa.alert.kind == "asymmetry" or not oa.cells:
                continue
            # each cell's deficit as measured, not as the next pulse confirmed it: confirmation (for the
            # alarms: a stall splits an iteration) cuts a deficit to 0 whenever a surplus follows, and a
            # loss's retransmissions bring surpluses: live, spine2 under a steady 2% loss on leaf1->spine2
            # (4x4x2, 4 MiB, 280 faulty pulses) resolved its alert 3 times on confirmed deficits, 2 on these
            gauss = [(float((smp.r if smp.raw is None else smp.raw)[idx]), float(v[idx]), float(smp.s[idx]))
                     for ci, idx in oa.cells if ci >= 0 for smp, v, _ in [judged[ci]] if smp.mask[idx]]
            damaged = [idx[0] for ci, idx in oa.cells if ci < 0 and cmask[idx[0]]]
            if not gauss and not damaged:
                continue
            lam0 = self.cfg.corruption_background
            lam1 = max(oa.ref_rate, self.cfg.min_rate, self.cfg.corruption_rate)
            more = (sum(reverse_llr_poisson(bad[p], frames[p], lam0, lam1) for p in damaged),
                    sum(2.0 * float(frames[p]) * (lam1 * math.log(lam1 / lam0) - lam1 + lam0) for p in damaged))
            if oa.repair.update(gauss, oa.ref_rate, self.cfg.min_rate, ln_a, floor, more):
                for ci, idx in oa.cells:
                    (self.poisson.reset(idx[0]) if ci < 0 else self.banks[ci].reset(idx))
                events.append(self.book.resolve(aid, pc.end_time, pc.pulse, pc.start_time))
        return events

    # -- learning from certified-healthy pulses ----------------------------------------------
    def _certify(self, t: int, judged) -> None:
        loud = bool(self.book.open) or any(
            bool((j.score()[smp.mask] >= self.cfg.quiet_level).any()) for smp, _, j in judged)
        if loud:
            self.pending.clear()
            return
        self.pending.append((t, [(chk.noise.sample(smp.r, smp.u, smp.mask, smp.cls), smp)
                                 for chk, (smp, _, _) in zip(self.checks, judged)]))
        while self.pending and self.pending[0][0] <= t - self.cfg.certify_lag:
            _, items = self.pending.popleft()
            for chk, ((ssq, n), smp) in zip(self.checks, items):
                chk.noise.learn(ssq, n)
                chk.learn(smp)

    # -- introspection (metrics, live view) ---------------------------------------------------
    def _scores(self, judged, cj: Judgement) -> None:
        best = np.full(self.nports, -1.0)
        for chk, (smp, _, j) in zip(self.checks, judged):
            np.maximum.at(best, chk.port_of_cell[smp.mask], j.score()[smp.mask])
        self.last_scores = {int(p): float(best[p]) for p in np.flatnonzero(best >= 0)}

    def port_scores(self) -> dict[int, float]:
        """Per port the largest CUSUM / threshold ratio of the last pulse (an alarm at >= 1)."""
        return dict(self.last_scores)

    @property
    def active(self) -> dict[str, OpenAlert]:
        return self.book.open

    @property
    def warming_up(self) -> bool:
        """Only the learned model measures before it judges (per source, ``learn_pulses`` pulses)."""
        if self.cfg.model is Model.ANALYTIC or not self.is_leaf:
            return False
        chk = self.checks[0]
        return bool((chk.learn_pulses < self.cfg.learn_pulses).any() and chk.learn_pulses.any())

    # -- the owner's verdicts (see agent.detector.verdict) -----------------------------------
    @property
    def ledger(self) -> Ledger | None:
        """The per-pulse evidence behind this switch's verdicts: a spine's on the links into it, a leaf's
        on the paths into it (when its counts carry sequence spans; see :meth:`owned_cells`)."""
        spine = next((c.ledger for c in self.checks if isinstance(c, SpineCheck)), None)
        if spine is not None:
            return spine
        return next((c.path_ledger for c in self.checks if type(c) is PeerCheck and c.path_ledger.rows), None)

    def owned_cells(self) -> dict[str, int]:
        """What this switch gives verdicts on -> its ledger cell: a spine the links into it
        (``leafA->spineK``), a leaf the paths into it (``leafA->spineK->leafM``: the same-packet reference
        of leaf A's flows through spine K, lossy whether ``leafA->spineK`` or ``spineK->leafM`` drops)."""
        chk = next((c for c in self.checks if isinstance(c, SpineCheck)), None)
        if chk is None:
            peer = next((c for c in self.checks if type(c) is PeerCheck), None)
            if peer is None or not peer.path_ledger.rows:
                return {}
            return {path_name(int(a), int(k), self.switch): peer.path_cell(int(a), int(k))
                    for a, k in zip(*np.nonzero(peer.usable))}
        links = (Link(p.peer, self.switch) for p in self.fabric.ports[self.switch])
        return {l.name: cell for l in links if (cell := chk.owned_cell(l)) is not None}

    def path_evidence(self, name: str, since: float | Sequence[Span]) -> LinkEvidence | None:
        """A leaf's same-packet evidence on a path into it (``leafA->spineK->`` this leaf) from pulses that
        started at or after ``since``; None if it keeps none."""
        cell = self.owned_cells().get(name) if self.is_leaf else None
        if cell is None:
            return None
        return path_evidence(self.ledger, cell, since, name, self.switch)

    def open_loss_links(self) -> set[str]:
        return {oa.alert.link for oa in self.book.open.values() if oa.alert.kind == "loss" and oa.alert.link}

    def owned_evidence(self, link: Link, since: float | Sequence[Span], loss: float) -> LinkEvidence | None:
        """This switch's evidence on a link it owns, from pulses that started at or after ``since``, for an
        alert of rate ``loss`` (its pulse timing, see :func:`evidence_from`); None if it does not judge
        that link."""
        cell = self.owned_cells().get(link.name)
        if cell is None:
            return None
        return evidence_from(self.ledger, cell, since, link.name, self.switch, link.name in self.open_loss_links(),
                             loss)

    def noise_factors(self) -> dict[str, float]:
        return {c.kind: c.noise.phi for c in self.checks}

    # -- persistence -----------------------------------------------------------------------
    def identity(self) -> dict:
        return {"version": STATE_VERSION, "switch": self.switch, "fabric": self.fabric.spec.to_dict(),
                "spray": str(self.spray), "config": self.cfg.to_dict(), "per_source": self.per_source}

    def state(self) -> dict:
        return {"identity": self.identity(), "out_of_service": sorted(l.name for l in self.oos), "weights": self.weights,
                "pulses_used": self.pulses_used,
                "banks": [b.state() for b in self.banks], "poisson": self.poisson.state(),
                "noise": [c.noise.state() for c in self.checks], "checks": [c.state() for c in self.checks],
                "open": {aid: oa.state() for aid, oa in self.book.open.items()}}

    def load_state(self, d: dict) -> None:
        """Continue from a saved state; ValueError if it belongs to another switch, fabric or setting."""
        if d.get("identity") != self.identity():
            raise ForeignState("saved detector state is for another switch, fabric state or configuration")
        now, now_w = list(self.oos), dict(self.weights)
        try:
            then = self.fabric.parse_link_list(d["out_of_service"])
            then_w = {str(k): float(v) for k, v in dict(d["weights"]).items()}
        except SpecError as e:
            raise ValueError(f"saved links out of service: {e}") from None
        moved = {l.name for l in then} != {l.name for l in now} or then_w != now_w
        if moved:
            self._set_out_of_service(then, then_w)   # saved before a spray change: its learned shares are of then
        for b, s in zip(self.banks, d["banks"]):
            b.load(s)
        self.poisson.load(d["poisson"])
        for c, s in zip(self.checks, d["noise"]):
            c.noise.load(s)
        for c, s in zip(self.checks, d["checks"]):
            c.load(s)
        self.book.open = {aid: OpenAlert.from_state(s) for aid, s in d["open"].items()}
        self.pulses_used = int(d["pulses_used"])
        if moved:
            self._set_out_of_service(now, now_w)   # (the agent tells when the change was: follow_changes)
