"""An alert's life at one switch: alarms become alerts (one per port, direction and kind, fed by every
cell that alarmed there), learned shares that contradict the model become asymmetry alerts, and every
open alert runs its repair test until the loss is gone (:class:`agent.detector.evidence.Repair`).

:class:`AlertLifecycle` works on its switch detector's checks, CUSUM banks and alert book
(:class:`agent.detector.switch.SwitchDetector` steps them and hands it each pulse's judgements).
"""
from __future__ import annotations

import math
import numpy as np
from scipy.special import ndtri

from agent.detector.alerts import Alert, AlertBook, AlertEvent, AlertKind, CheckKind, OpenAlert
from agent.detector.checks import Check, CorruptionCheck, Suspect
from agent.detector.config import DetectorConfig
from agent.detector.evidence import CusumBank, Judgement, PoissonCusum, Repair, repair_ln_arl, reverse_llr_poisson
from agent.pulse import PulseCounts
from netns_testbed.topo import Fabric


class AlertLifecycle:
    """The switch detector's checks, their CUSUM banks, the damaged-frame test and the alert book, as the
    detector built them; each call gets the pulse's judgements and where the detector stands (pulses
    used, the pulse's ln ARL)."""

    def __init__(self, fabric: Fabric, switch: str, cfg: DetectorConfig, alpha: float, checks: list[Check],
                 banks: list[CusumBank], corruption: CorruptionCheck, poisson: PoissonCusum, book: AlertBook) -> None:
        self.fabric, self.switch, self.cfg, self.alpha = fabric, switch, cfg, alpha
        self.checks, self.banks, self.corruption, self.poisson, self.book = checks, banks, corruption, poisson, book
        self.pulses_used = 0
        self.ln_arl = 0.0

    def aid(self, sus: Suspect, kind: AlertKind) -> str:
        return f"{self.switch}/{sus.port}/{sus.direction}/{kind.value}"

    # -- alarms -> alerts --------------------------------------------------------------
    def alarms(self, pc: PulseCounts, judged, cj: Judgement) -> list[Alert]:
        hits: dict[str, list[tuple[int, tuple, float]]] = {}
        for i, (smp, _, j) in enumerate(judged):
            for idx in zip(*np.nonzero(j.alarm)):
                idx = tuple(int(x) for x in idx)
                rate = self.banks[i].estimate(idx)[0]
                if rate < self.cfg.min_rate:
                    continue
                sus = self.checks[i].suspects(idx)
                hits.setdefault(self.aid(sus, AlertKind.LOSS), []).append((i, idx, float(j.score()[idx])))
        for p in np.flatnonzero(cj.alarm):
            sus = self.corruption.suspects((int(p),))
            hits.setdefault(self.aid(sus, AlertKind.CORRUPTION), []).append((-1, (int(p),), float(cj.ratio[0, p])))
        events = []
        for aid, found in hits.items():
            ci, idx, score = max(found, key=lambda c: c[2])
            cells = {(c[0], c[1]) for c in found}
            alert = self._make_alert(pc, aid, ci, idx, score, cells)
            ev = self.book.publish(alert, cells, pc.pulse)
            if ev is not None:
                events.append(ev)
        return events

    def _make_alert(self, pc: PulseCounts, aid: str, ci: int, idx: tuple, score: float,
                    cells: set[tuple[int, tuple]]) -> Alert:
        if ci < 0:
            rate, ci95, onset, onset_time, deficit = self.poisson.estimate(idx[0])
            sus, kind, test = self.corruption.suspects(idx), AlertKind.CORRUPTION, CheckKind.CORRUPTION
            per_rate = None
        else:
            rate, ci95, onset, onset_time, deficit = self.banks[ci].estimate(idx)
            chk = self.checks[ci]
            sus, kind, test = chk.suspects(idx), AlertKind.LOSS, chk.kind
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
        return Alert(event=AlertEvent.ALERT, alert_id=aid, time=pc.end_time, switch=self.switch, port=sus.port,
                     ifname=port.ifname, direction=sus.direction, link=link.name if link else None,
                     candidates=[c.name for c in cands], kind=kind, estimated_rate=round(rate, 6),
                     rate_ci=[round(ci95[0], 6), round(ci95[1], 6)], score=round(score, 3),
                     window=self.pulses_used - onset, pulse=pc.pulse, pulse_start=pc.start_time, onset_pulse=onset,
                     onset_time=onset_time,
                     evidence={"test": test.value, "source": sus.source, "deficit": round(deficit, 1),
                               "deficit_per_unit_rate": None if per_rate is None else round(per_rate, 1),
                               "rate_sd": round((ci95[1] - rate) / 1.96, 6),
                               "window_start": onset_time, "ln_arl": round(self.ln_arl, 3)})

    def findings(self, pc: PulseCounts) -> list[Alert]:
        """Learned model: shares measured at start that contradict the analytic model."""
        events = []
        for chk in self.checks:
            found = chk.take_findings()
            if not found:
                continue
            ncells = max(1, int(np.sum(chk.usable)))
            z_star = float(-ndtri(self.alpha / ncells))
            for idx, rate, z in found:
                if z <= z_star or rate < self.cfg.min_rate:
                    continue
                sus = chk.suspects(idx)
                aid = self.aid(sus, AlertKind.ASYMMETRY)
                port = self.fabric.port(self.switch, sus.port)
                alert = Alert(event=AlertEvent.ALERT, alert_id=aid, time=pc.end_time, switch=self.switch,
                              port=sus.port, ifname=port.ifname, direction=sus.direction, link=None,
                              candidates=[c.name for c in sus.candidates], kind=AlertKind.ASYMMETRY,
                              estimated_rate=round(rate, 6), rate_ci=[0.0, 0.0], score=round(z / z_star, 3),
                              window=self.cfg.learn_pulses, pulse=pc.pulse, pulse_start=pc.start_time,
                              onset_pulse=self.pulses_used - self.cfg.learn_pulses, onset_time=pc.start_time,
                              evidence={"test": CheckKind.SHARES.value, "source": sus.source, "z": round(z, 2),
                                        "z_threshold": round(z_star, 2)})
                if aid not in self.book.open:
                    self.book.open[aid] = OpenAlert(alert, set(), Repair(), pc.pulse)
                    events.append(alert)
        return events

    # -- repair ------------------------------------------------------------------------
    def repairs(self, pc: PulseCounts, judged, corr) -> list[Alert]:
        """Every open alert's repair test (:class:`agent.detector.evidence.Repair`)."""
        bad, frames, cmask = corr
        events = []
        floor = math.log(self.cfg.clear_lr)
        ln_a = repair_ln_arl(self.cfg.false_clears_per_day, self.cfg.pulse_hz)
        for aid, oa in list(self.book.open.items()):
            if oa.alert.kind is AlertKind.ASYMMETRY or not oa.cells:
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
