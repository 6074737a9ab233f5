"""Sequential evidence per cell: a bank of one-sided CUSUMs and the reverse test that clears.

Forward (is there a loss?). For loss magnitude ``p_j`` a cell's pulse deficit
``r`` (expected minus observed packets) has mean ``mu_j = p_j * s`` (``s``: the
deficit one unit of loss rate causes, from the check) and null variance ``V``.
The Gaussian log-likelihood ratio of "loss p_j" against "no loss" is
``(mu_j r - mu_j^2 / 2) / V``; Page's CUSUM accumulates it,
``S_j = max(0, S_j + LLR)``, and alarms when ``S_j > h_j``. ``h_j`` follows from
the shift ``delta_j = mu_j / sqrt(V)`` and the in-control ARL the budget
requires (:func:`agent.detector.arl.thresholds`). The change point is the
pulse after the CUSUM's last zero (its maximum-likelihood onset); the rate
estimate is ``sum r / sum s`` since then, with a normal 95% interval whose
variance is the null noise ``sum V`` plus the loss's own: a rate ``r`` takes a
binomial count of about ``r * s`` packets, variance ``r * s``.

Reverse (is it repaired?). While an alert is open, its cells run the mirror
CUSUM of "no loss" against "the loss at the rate its own pulses estimate"
(:class:`Repair`); once it passes the threshold the false-repair budget gives
(``false_clears_per_day``, at least ``ln(clear_lr)``) the alert resolves and the
forward CUSUMs of its cells restart from zero. The forward statistic is capped
at ``CAP`` times its threshold, so evidence does not pile up during a long fault.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.detector.arl import thresholds

CAP = 4.0   # a CUSUM never holds more than CAP times its threshold


@dataclass
class Judgement:
    """One pulse's verdict of a bank: per magnitude and cell."""

    ratio: np.ndarray        # S / h (alarm where > 1), shape (M, *cells)
    alarm: np.ndarray        # bool, shape cells: any magnitude over its threshold

    def score(self) -> np.ndarray:
        """Per cell the largest S/h over the magnitudes."""
        return self.ratio.max(axis=0)


class CusumBank:
    """Page's CUSUMs for every (magnitude, cell) of one check, updated together (numpy)."""

    def __init__(self, magnitudes: tuple[float, ...], shape: tuple[int, ...]) -> None:
        self.p = np.asarray(magnitudes, dtype=float).reshape((-1,) + (1,) * len(shape))
        full = (len(magnitudes),) + tuple(shape)
        self.stat = np.zeros(full)
        self.onset = np.zeros(full, dtype=np.int64)        # first pulse of the current excursion
        self.onset_time = np.zeros(full)
        self.sum_r = np.zeros(full)
        self.sum_s = np.zeros(full)
        self.sum_v = np.zeros(full)
        self.h = np.zeros(full)

    def shifts(self, s: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Per (magnitude, cell) the shift in standard deviations the magnitude would cause."""
        return self.p * s / np.sqrt(v)

    def update(self, r: np.ndarray, v: np.ndarray, s: np.ndarray, mask: np.ndarray, t: int, time: float,
               ln_arl: float) -> Judgement:
        mu = self.p * s                                   # (M, *cells)
        llr = (mu * r - 0.5 * mu * mu) / v
        new = np.maximum(0.0, self.stat + llr)
        m = np.broadcast_to(mask, new.shape)
        starting = m & (self.stat <= 0.0) & (new > 0.0)
        self.onset = np.where(starting, t, self.onset)
        self.onset_time = np.where(starting, time, self.onset_time)
        zero = m & (new <= 0.0)
        keep = m & ~zero
        for acc, x in ((self.sum_r, r), (self.sum_s, s), (self.sum_v, v)):
            acc[...] = np.where(zero, 0.0, np.where(keep, acc + x, acc))
        delta = mu / np.sqrt(v)
        self.h = np.where(m, thresholds(delta, ln_arl), np.where(self.h > 0, self.h, np.inf))
        # capped so that a long fault does not build up evidence that takes ages to drain
        self.stat = np.where(m, np.minimum(new, CAP * self.h), self.stat)
        ratio = self.stat / self.h
        return Judgement(ratio, (ratio > 1.0).any(axis=0) & mask)

    def best(self, idx: tuple) -> int:
        """Magnitude index with the largest S/h at a cell."""
        return int(np.argmax(self.stat[(slice(None),) + idx] / self.h[(slice(None),) + idx]))

    def estimate(self, idx: tuple) -> tuple[float, tuple[float, float], int, float, float]:
        """(rate, 95% interval, onset pulse, onset time, deficit) of a cell's best CUSUM."""
        j = self.best(idx)
        k = (j,) + idx
        ss = self.sum_s[k]
        rate = self.sum_r[k] / ss if ss > 0 else 0.0
        # The split's noise (sum_v), and the loss's own: a loss at rate r drops a binomial count of about
        # r * ss packets (variance r * ss). Without it a few packets of a small cell read as a precise
        # rate (live: 4 of a 100-packet cell at a leaf, 4.2% +- 0.65%; the spine's 0.3% +- 0.5% over two
        # pulses then "proved" the upstream link intact, and the incident named the healthy downstream
        # link while the real 1% loss was upstream).
        sd = math.sqrt(self.sum_v[k] + max(rate, 0.0) * ss) / ss if ss > 0 else 0.0
        return rate, (max(0.0, rate - 1.96 * sd), rate + 1.96 * sd), int(self.onset[k]), float(self.onset_time[k]), \
            float(self.sum_r[k])

    def reset(self, idx: tuple) -> None:
        for a in (self.stat, self.sum_r, self.sum_s, self.sum_v):
            a[(slice(None),) + idx] = 0.0

    def state(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("stat", "onset", "onset_time", "sum_r", "sum_s", "sum_v")}

    def load(self, d: dict) -> None:
        for k in ("stat", "onset", "onset_time", "sum_r", "sum_s", "sum_v"):
            arr = np.asarray(d[k], dtype=getattr(self, k).dtype)
            if arr.shape != getattr(self, k).shape:
                raise ValueError(f"saved {k} has shape {arr.shape}, expected {getattr(self, k).shape}")
            setattr(self, k, arr)


class PoissonCusum:
    """CUSUM of damaged-frame counts: Poisson rate ``lam1`` against the background ``lam0`` per frame.

    The increment is the exact log-likelihood ratio ``b ln(lam1/lam0) - n (lam1 - lam0)`` for ``b``
    damaged frames among ``n``; Lorden's bound (ARL0 >= e^h for a CUSUM of likelihood ratios)
    gives the threshold ``h = ln ARL0`` without a table (conservative: this test almost never
    comes near it on a healthy link).
    """

    def __init__(self, lam0: float, lam1: float, n: int) -> None:
        self.lam0, self.lam1 = lam0, lam1
        self.stat = np.zeros(n)
        self.onset = np.zeros(n, dtype=np.int64)
        self.onset_time = np.zeros(n)
        self.bad = np.zeros(n)
        self.frames = np.zeros(n)
        self.h = np.inf

    def update(self, bad: np.ndarray, frames: np.ndarray, mask: np.ndarray, t: int, time: float,
               ln_arl: float) -> Judgement:
        llr = bad * math.log(self.lam1 / self.lam0) - frames * (self.lam1 - self.lam0)
        new = np.maximum(0.0, self.stat + llr)
        starting = mask & (self.stat <= 0) & (new > 0)
        self.onset = np.where(starting, t, self.onset)
        self.onset_time = np.where(starting, time, self.onset_time)
        zero = mask & (new <= 0)
        keep = mask & ~zero
        self.bad = np.where(zero, 0.0, np.where(keep, self.bad + bad, self.bad))
        self.frames = np.where(zero, 0.0, np.where(keep, self.frames + frames, self.frames))
        self.h = max(ln_arl, 1e-3)
        self.stat = np.where(mask, np.minimum(new, CAP * self.h), self.stat)
        ratio = (self.stat / self.h)[None, :]
        return Judgement(ratio, (ratio[0] > 1.0) & mask)

    def estimate(self, i: int) -> tuple[float, tuple[float, float], int, float, float]:
        n = max(self.frames[i], 1.0)
        rate = self.bad[i] / n
        sd = math.sqrt(max(self.bad[i], 1.0)) / n
        return rate, (max(0.0, rate - 1.96 * sd), rate + 1.96 * sd), int(self.onset[i]), float(self.onset_time[i]), \
            float(self.bad[i])

    def reset(self, i: int) -> None:
        self.stat[i] = self.bad[i] = self.frames[i] = 0.0

    def state(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("stat", "onset", "onset_time", "bad", "frames")}

    def load(self, d: dict) -> None:
        for k in ("stat", "onset", "onset_time", "bad", "frames"):
            arr = np.asarray(d[k], dtype=getattr(self, k).dtype)
            if arr.shape != getattr(self, k).shape:
                raise ValueError(f"saved {k} has shape {arr.shape}, expected {getattr(self, k).shape}")
            setattr(self, k, arr)


def reverse_llr(r: float, v: float, mu: float) -> float:
    """Log-likelihood ratio of "no loss" against "loss with mean deficit mu" for one pulse.

    Under the loss the deficit also carries the binomial noise of the losses themselves
    (about mu packets^2 on top of the null variance v); with equal variances one pulse
    that happens to lose little would look like a repair under rrdst, where v ~ 1.
    """
    v1 = v + mu
    return (r - mu) ** 2 / (2 * v1) - r * r / (2 * v) + 0.5 * math.log(v1 / v)


def reverse_llr_poisson(bad: float, frames: float, lam0: float, lam1: float) -> float:
    return frames * (lam1 - lam0) - bad * math.log(lam1 / lam0)


SECONDS_PER_DAY = 86400.0
# The repair test's alternative is the loss rate's lower confidence bound at this many sds: the
# estimate from an alert's first few pulses is noisy, and one that reads high makes "no loss" win
# early. Gaussian streams, 50 pulses of a loss at 0.5 / 1 / 2 sd per pulse, 200 alerts each
# (bench/repair.py --streams --lcb-sd X): resolved during the loss at the estimate itself 50 / 28 / 6,
# at 1 sd 15 / 3 / 1, at 2 sd 1 / 0 / 0; the median pulses to see the repair after it 26 / 14 / 5,
# 73 / 21 / 6 and 226 / 34 / 7.
REPAIR_LCB_SD = 2.0


def repair_ln_arl(false_clears_per_day: float, pulse_hz: float) -> float:
    """ln of the pulses an alert's repair test must run, on average, under a loss that stays, before it
    resolves the alert falsely: one day's pulses over the budget."""
    return math.log(SECONDS_PER_DAY * pulse_hz / false_clears_per_day)


@dataclass
class Repair:
    """The repair test of one open alert: Page's CUSUM of "no loss" against "the loss at the rate the
    alert's own pulses estimate".

    The rate it holds: ``sum r s / V`` over ``sum s^2 / V`` of the alert's judged cells since it opened
    (the deficit's least-squares estimate) less ``REPAIR_LCB_SD`` of its sds (``1 / sqrt(sum s^2 / V)``),
    as it stood when the statistic was last at 0, so the pulses after a repair do not pull it down while
    they are being judged (unless the statistic falls back to 0 after the repair, as it can for an alert
    of under one sd per pulse: then they do, and its repair takes longer). The largest rate estimated while
    open, which it replaces, was the alarm's selection at its peak: under a loss that stays, a CUSUM
    with the alternative at twice the loss drifts towards "repaired", and in the counter model 27 alerts
    resolved during 16 runs of 600 faulty pulses (``bench/repair.py``).

    Its threshold is read from the alarms' ARL table (:func:`agent.detector.arl.thresholds`): the
    statistic is a Gaussian CUSUM whose shift is this pulse's ``delta = sqrt(sum mu^2 / V)`` over the
    judged cells (``mu`` the held rate's deficit; a Poisson cell counts ``2 KL``, the same information),
    so the run length under a loss that stays at the held rate is the table's in-control ARL. That is
    set by the budget, ``SECONDS_PER_DAY * pulse_hz / false_clears_per_day`` pulses (86,400 at the
    defaults), and never below ``ln(clear_lr)`` nats. The price is the time to see a repair: about
    ``h / (delta^2 / 2)`` pulses at the held rate (below the loss's own), with ``h`` 7.2-9.8 nats from
    0.2 to 4 sd per pulse against 4.6 at ``clear_lr`` alone."""

    stat: float = 0.0
    est_a: float = 0.0
    est_b: float = 0.0
    held_rate: float | None = None

    def estimate(self) -> float:
        """The rate's lower confidence bound: the estimate less ``REPAIR_LCB_SD`` of its sds."""
        return self.est_a / self.est_b - REPAIR_LCB_SD / math.sqrt(self.est_b)

    def rate(self, fallback: float) -> float:
        """The rate the alternative holds (``fallback`` before any pulse was judged)."""
        if self.held_rate is not None:
            return self.held_rate
        return self.estimate() if self.est_b > 0 else fallback

    def observe(self, cells: list[tuple[float, float, float]]) -> None:
        """This pulse's judged Gaussian cells ``(r, V, s)`` into the rate estimate (before :meth:`step`)."""
        for r, v, s in cells:
            self.est_a += r * s / v
            self.est_b += s * s / v

    @staticmethod
    def evidence(cells: list[tuple[float, float, float]], rate: float) -> tuple[float, float]:
        """This pulse's log-likelihood ratio of "no loss" against ``rate`` over the Gaussian cells ``(r, V,
        s)``, and its information ``delta^2 = sum mu^2 / V``."""
        llr = sum(reverse_llr(r, v, rate * s) for r, v, s in cells)
        return llr, sum((rate * s) ** 2 / v for _, v, s in cells)

    def update(self, cells: list[tuple[float, float, float]], fallback: float, min_rate: float, ln_a: float,
               floor: float, more: tuple[float, float] = (0.0, 0.0)) -> bool:
        """One pulse of the alert: its judged Gaussian cells ``(r, V, s)`` into the estimate, then the
        ratio against the held rate (at least ``min_rate``; ``fallback`` before any pulse was judged), plus
        ``more`` (ratio, information) from cells of other kinds; True when the alert is repaired."""
        self.observe(cells)
        llr, info = self.evidence(cells, max(self.rate(fallback), min_rate))
        return self.step(llr + more[0], info + more[1], ln_a, floor)

    def step(self, llr: float, info: float, ln_a: float, floor: float) -> bool:
        """Add one pulse's log-likelihood ratio ("no loss" against the held rate) with its information
        ``delta^2``; True when the alert is repaired."""
        self.stat = max(0.0, self.stat + llr)
        if self.stat == 0.0 and self.est_b > 0:
            self.held_rate = self.estimate()
        return self.stat > max(floor, float(thresholds(np.array([math.sqrt(max(info, 0.0))]), ln_a)[0]))

    def state(self) -> dict:
        return {"reverse": self.stat, "est_a": self.est_a, "est_b": self.est_b, "held_rate": self.held_rate}

    @classmethod
    def from_state(cls, d: dict) -> "Repair":
        held = d.get("held_rate")
        return cls(float(d.get("reverse", 0.0)), float(d.get("est_a", 0.0)), float(d.get("est_b", 0.0)),
                   None if held is None else float(held))
