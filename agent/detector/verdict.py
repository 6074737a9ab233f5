"""The owner's verdict on a link it owns, and how a downstream switch's alert is settled by it.

Every directed fabric link has an owner: its downstream switch. A spine owns
``leafA->spineK`` (what arrives on its port from leaf A); a leaf owns
``spineK->leafM``. A leaf's deficit on uplink K for traffic from a single source
leaf A points at two links, ``spineK->leafM`` (its own) and ``leafA->spineK``
(spine K's). The leaf does not look at spine K's counters: it asks spine K for
its *verdict* on ``leafA->spineK`` since the leaf's own estimated onset.

A verdict is the owner's likelihood for the loss rate on its link over a time
window: per judged pulse the owner's balance test gives a deficit ``r`` with
null variance ``V`` and the deficit ``s`` a unit loss rate would cause; the
sufficient statistics ``a = r s / V`` and ``b = s^2 / V`` summed over the window
give the rate estimate ``q = sum a / sum b`` with standard deviation
``1 / sqrt(sum b)``, plus the timing of the window's edges, widened when the
window's pulses scatter more than the model allows (see :func:`evidence_from`).
The owner keeps them per pulse in a :class:`Ledger` (a bounded ring) and exports
them like its alerts (no counters are exchanged). Only pulses that started at or
after the onset count: evidence from before the fault cannot vote.

Timing. A spine's balance compares a leaf's outflow with its inflow: different
flows, whose progress can differ at a pulse boundary. A boundary that moves
``H`` packets from one pulse to the next adds ``H`` to one pulse's deficit and
takes it from the next one's: ``r_t = loss_t + H_t - H_{t-1}``. Summed over a
window the inner boundaries cancel and its two edges stay: this part of the
estimate's error falls as ``1/n`` over ``n`` pulses, and dominates the first two
or three. The lag-1 autocovariance of the spines' per-pulse deficits gives
``var(H)`` (``bench/pulse_timing.py``, on 27 live runs of a 2x2x2 ring allreduce
with a 5% drop on leaf0->spine1, three or four busy loops beside it on two CPUs,
shipped in bench/data/timing-2x2x2, and 8 of the 9 runs of
tests/data/recorded-runs, 4x4x2, 2% drops; the ninth ends 4 pulses into its
fault): under the fault the boundaries' sd is 0-1.7% of a pulse's expected
count; before it mostly under 0.25% (the loss's own recovery stalls the ring).
The model: Gaussian, with variance ``TIMING_VAR_PER_LOSS`` times the loss rate
in squared shares of the expected count, the median of the runs' ratios (0.0015;
quartiles 0.0001 and 0.0034): sd 0.87% at 5%, 0.55% at 2%, 0.39% at 1%. Without
it two pulses that read -0.95% +- 1.40% settled "intact" on a 5% upstream loss
(the project's CI, 2x2x2: a healthy link named; that run kept no pulses, and two
edges that moved about 6% of a pulse's count explain the reading;
tests/test_incidents.py has its numbers). Streams with boundaries drawn at the
measured levels stay inside the 1/DECIDE_LR budget with it
(tests/test_incidents.py). A busy machine also moves boundaries without any loss
(1.0% before the fault in one run; DDP's first broadcast up to 4%), which the
model does not count: at a small loss the verdict takes enough pulses for the
edges not to matter.

:func:`settle` compares the two hypotheses on the owner's estimate ``q``:

* upstream (``leafA->spineK`` drops at the leaf's rate ``p``): the owner misses
  the same packets, ``q ~ N(p, sd_q^2 + sd_p^2 + (MODEL_ERROR p)^2)``;
* downstream (``spineK->leafM`` drops): the owner's link is intact and leaf A's
  retransmissions even add to what it receives: ``q ~ N(mu, sd_q^2)`` with
  ``mu <= 0`` (the most likely such ``mu``, i.e. ``min(q, 0)``).

It decides when the log-likelihood ratio passes ``ln(DECIDE_LR)`` either way
(Wald: a wrong decision has probability below ``1 / DECIDE_LR``), and waits
otherwise. An owner with an alert open on the link has already decided.

The same-packet reference (``Reference.SPAN``: counts with sequence spans, see
agent.detector.checks.span_samples) changes three things. The owner's rate is
its link's own loss rate, read from the same packets a downstream leaf counts:
no pulse timing (no fold, no timing term) and no model between the two ends.
The leaf keeps the same evidence on its path (``leafA->spineK->leafM``), and
the tracker settles with that path's rate and sd in place of the alert's and
``model_error`` 0, over the window from the loss's most likely onset on the
path (:meth:`Ledger.onset`). And a window's scatter is judged against each
pulse's null noise plus the loss's own binomial noise, so the evidence's sd
stays the null one under a loss.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

DECIDE_LR = 100.0      # odds either way before an ambiguous alert names a link
MODEL_ERROR = 0.25     # one sd of the owner's deficit relative to the leaf's (retransmission timing, spray)
LEDGER_PULSES = 256    # pulses an owner keeps (at 1 Hz: four minutes)
SLACK_S = 0.05         # pulses of one iteration start within this of each other at every switch
# The window's scatter against the model's variance (Birge ratio) is shrunk towards 1 with this many
# degrees of freedom of prior weight: two pulses alone give chi^2 with one degree of freedom, above 1 a
# third of the time, and widening on that delayed 8 of 100 model verdicts by more than an iteration.
SCATTER_PRIOR_DOF = 4.0
HELD_BACK_Z = 3.0      # a pulse this far (sd) from the window's other pulses may have been held back
# Variance of the share of a pulse's expected count that a boundary moves, per unit of the loss rate
# (the loss's recovery episodes stall the ring: the variance grows with their number); see above.
TIMING_VAR_PER_LOSS = 0.0015
# A loss's onset is moved later than the alert's (Ledger.onset) only when that is this many nats more
# likely: one pulse that read low by chance must not take the loss's first pulse out of the window.
ONSET_GAIN = 3.0
# A spine's cell of one source leaf's flows towards one destination leaf settles a leaf's alert only
# when it expected at least this many segments a pulse over the window (the mean over its judged
# pulses); below, the alert is settled on the whole port (agent.incidents). The noise model (phi_e e)
# holds for the cells it was fitted on and not for small ones: over the healthy pulses of 40 live runs
# (a 36-run sweep and the four workloads of tests/test_localize_live.py; `bench/span_floor.py RUNS`
# prints it per cell size), cells of 1,000-3,000 segments scatter 2.62 segments against the model's
# 2.96, cells of 20-200 (a ring's stray flows towards a third leaf) 5.55 against 0.62: the segment-size
# mix of a few messages under a deterministic rotation, not the count. Such a cell read a 2% loss on
# leafA->spineK as a 2.7% surplus "intact" (reduce_scatter, a fresh clone's test command) and the
# healthy downstream link was named. Over the window, not per pulse: a cell near the bound (a
# mitigation's canary cuts the suspect uplink to a quarter of its share) judged in one pulse of nine
# left the alert waiting on one pulse while the leaf's own evidence had nine (live, allreduce 2 MiB,
# 2% on leaf2->spine1, tests/test_prometheus.py's drain test): it paged as "localizing".
DEST_MIN_SEGMENTS = 1000.0


def judges_the_same_flows(ev: LinkEvidence | None) -> bool:
    """Whether an owner's evidence on a link's flows towards one leaf (``toward``) can settle that leaf's
    alert: judged, and (the same-packet reference) of cells large enough for the noise model
    (:data:`DEST_MIN_SEGMENTS`)."""
    return ev is not None and not math.isinf(ev.sd) and (ev.segments is None or ev.segments >= DEST_MIN_SEGMENTS)


class Reference(str, Enum):
    """What an owner's ledger judges by."""

    BALANCE = "balance"   # a spine's in/out balance of a leaf (different packets: timing and model error)
    SPAN = "span"         # the same-packet reference: new bytes against the flows' sequence spans

    def __str__(self) -> str:
        return self.value


class Verdict(str, Enum):
    UPSTREAM = "upstream"       # the owner's link is lossy
    DOWNSTREAM = "downstream"   # the owner's link is intact: the asking switch's own link is lossy
    UNDECIDED = "undecided"     # not enough evidence yet
    UNJUDGED = "unjudged"       # the owner does not judge this link (out of service, too little traffic)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LinkEvidence:
    """An owner's evidence on one link over a window: what it exports."""

    link: str
    owner: str
    rate: float          # estimated loss rate (can be negative: more arrived than expected)
    sd: float            # its standard deviation (inf when nothing was judged)
    pulses: int          # judged pulses in the window
    alert_open: bool     # the owner has a loss alert open on this link
    reference: Reference = Reference.BALANCE
    start: float | None = None   # where the window it judged began, when the owner chose it (a path's onset)
    segments: float | None = None   # the same-packet reference: segments expected per judged pulse (mean)

    def to_dict(self) -> dict:
        return {"link": self.link, "owner": self.owner, "rate": round(self.rate, 6),
                "sd": None if math.isinf(self.sd) else round(self.sd, 6), "pulses": self.pulses,
                "alert_open": self.alert_open, "reference": str(self.reference),
                **({"start": self.start} if self.start is not None else {}),
                **({"segments": round(self.segments, 1)} if self.segments is not None else {})}


# Pulses an alert was open over: those that started at or after the first time and before the second
# (the start of the pulse it resolved at; inf while it is open). A fault that comes and goes (a flapping
# link) raises one short alert per burst; its owner's evidence is read over every burst's span, never over
# the healthy pulses between them.
Span = tuple[float, float]


def spans(since: "float | Sequence[Span]") -> list[Span]:
    """``since`` as spans: a time is one span from it on."""
    if isinstance(since, (int, float)):
        return [(float(since), math.inf)]
    return [(float(lo), float(hi)) for lo, hi in since]


# One pulse's (a, b, w) in a cell. The third column is the balance's timing weight ``b * expected / s``
# (see :func:`timing_variance`); the same-packet reference has no pulse timing, and keeps there the
# segments at stake ``s`` (what a loss's own binomial noise scales with: a rate q adds q / s to one
# pulse's variance of its rate).
Row = tuple[float, float, float]


class Ledger:
    """Per pulse and cell the sufficient statistics of an owner's test, for the last ``LEDGER_PULSES`` pulses."""

    def __init__(self, ncells: int, maxlen: int = LEDGER_PULSES, reference: Reference = Reference.BALANCE) -> None:
        self.ncells = ncells
        self.reference = reference
        self.rows: deque[tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = deque(maxlen=maxlen)

    def add(self, start_time: float, r: np.ndarray, v: np.ndarray, s: np.ndarray, expected: np.ndarray,
            mask: np.ndarray) -> None:
        """One pulse: per cell the deficit ``r``, its null variance ``v``, the deficit ``s`` a unit loss
        rate causes and the expected count (what a pulse boundary's timing moves a share of; unused by
        the same-packet reference, which keeps ``s`` instead: see :data:`Row`)."""
        ok = mask & (s > 0)
        a = np.where(ok, r * s / v, 0.0)
        b = np.where(ok, s * s / v, 0.0)
        if self.reference is Reference.SPAN:
            bg = np.where(ok, s, 0.0)
        else:
            bg = np.where(ok, b * expected / np.where(ok, s, 1.0), 0.0)
        self.rows.append((float(start_time), a, b, bg, ok.astype(np.int64)))

    def window(self, cell: int, since: "float | Sequence[Span]") -> list[Row]:
        """The judged pulses that started at or after ``since``, in order, with a pulse boundary's timing
        taken out (see :func:`fold_held_back`). ``since`` may instead be spans (see :data:`Span`): the
        pulses of each, each span folded on its own."""
        out: list[Row] = []
        for lo, hi in spans(since):
            rows: list[Row] = []
            before = None                      # the pulse just before the span, if judged
            for t, a, b, bg, m in self.rows:
                judged = bool(m[cell]) and b[cell] > 0
                row = (float(a[cell]), float(b[cell]), float(bg[cell]))
                if t < lo - SLACK_S:
                    before = row if judged else None
                elif t < hi - SLACK_S and judged:
                    rows.append(row)
            # the same-packet reference has no pulse timing to take out: a pulse boundary moves spans and
            # new bytes together
            out += rows if self.reference is Reference.SPAN else fold_held_back(rows, before)
        return out

    def onset(self, cell: int, since: "float | Sequence[Span]") -> float | None:
        """Where a loss in ``cell`` most likely began, at or after the start of ``since``'s last span (the
        same-packet reference only): the judged pulse ``s`` that maximises the profile likelihood of
        "no loss before ``s``, a constant loss from ``s`` on" (each pulse's rate ``a / b`` with its null
        variance ``1 / b`` plus the loss's own ``q / s``), if it beats the span's first pulse by
        ``ONSET_GAIN`` nats; else that first pulse. None without a judged pulse. The alarms' onset (a
        CUSUM's last zero) is often a pulse or two early, and pulses before the loss dilute a verdict."""
        lo, hi = spans(since)[-1]
        rows = [(t, float(a[cell]), float(b[cell]), float(w[cell])) for t, a, b, w, m in self.rows
                if lo - SLACK_S <= t < hi - SLACK_S and m[cell] and b[cell] > 0]
        if not rows or self.reference is not Reference.SPAN:
            return rows[0][0] if rows else None

        def gain(k: int) -> float:
            kept = rows[k:]
            q = max(sum(r[1] for r in kept) / sum(r[2] for r in kept), 0.0)
            out = 0.0
            for _, a, b, seg in kept:
                x, v0 = a / b, 1.0 / b
                v1 = v0 + q / max(seg, 1.0)
                out += -0.5 * (x - q) ** 2 / v1 - 0.5 * math.log(v1) + 0.5 * x * x / v0 + 0.5 * math.log(v0)
            return out

        gains = [gain(k) for k in range(len(rows))]
        best = int(np.argmax(gains))
        return rows[best][0] if gains[best] - gains[0] >= ONSET_GAIN else rows[0][0]

    def state(self, cells: Sequence[int] | None = None) -> list:
        """The rows as lists, of every cell or of ``cells`` alone (in that order)."""
        if cells is None:
            return [[t, a.tolist(), b.tolist(), bg.tolist(), m.tolist()] for t, a, b, bg, m in self.rows]
        ix = np.asarray(cells, dtype=np.int64)
        return [[t, a[ix].tolist(), b[ix].tolist(), bg[ix].tolist(), m[ix].tolist()] for t, a, b, bg, m in self.rows]

    def judged_cells(self) -> set[int]:
        """The cells judged in at least one kept pulse."""
        if not self.rows:
            return set()
        return {int(c) for c in np.flatnonzero(np.any([m for *_, m in self.rows], axis=0))}

    def load(self, rows: list) -> None:
        self.rows.clear()
        for row in rows:
            if len(row) != 5:
                raise ValueError(f"saved ledger row has {len(row)} fields, expected 5 (an older agent's format)")
            t, a, b, bg, m = row
            if not len(a) == len(b) == len(bg) == len(m) == self.ncells:
                raise ValueError(f"saved ledger has {len(a)} cells, expected {self.ncells}")
            self.rows.append((float(t), np.asarray(a, float), np.asarray(b, float), np.asarray(bg, float),
                              np.asarray(m, np.int64)))


def _apart(row: Row, rest: tuple[float, float]) -> float:
    """How many sd one pulse's rate stands from the estimate of the ``rest`` (sums of a and b), counting
    the rest's own uncertainty; 0 when there is no rest."""
    (a, b, _), (ra, rb) = row, rest
    if rb <= 0:
        return 0.0
    return (a / b - ra / rb) / math.sqrt(1.0 / b + 1.0 / rb)


def fold_held_back(rows: list[Row], before: Row | None = None) -> list[Row]:
    """The window's pulses with a pulse boundary's timing taken out. A boundary that holds a leaf's
    packets back gives one pulse short and the next as much over (live, allgather, spine1 on a 2% loss:
    -8.5% then +10.9%, 1.1% sd each). Apart, the pair put chi^2 ~ 160 into the window's scatter, which
    widened the estimate's sd for the rest of the fault and kept a 2% loss undecided from the pair to
    the end of the job (a fresh clone's test run: the incident never named its link).

    * Two consecutive pulses that each stand beyond ``HELD_BACK_Z`` sd from the estimate of the other
      pulses, on opposite sides, are summed into one pulse (one pulse's worth of evidence).
    * The newest pulse, standing that far from the others, is left out until its successor shows
      whether it was held back: counted alone it pulls the estimate by its whole shortfall and, with
      the pairs before it folded, the scatter no longer guards against it.
    * The oldest pulse, standing that far from the others on the opposite side from the pulse before
      the window (``before``), is the return of packets held back before the window: left out.

    Each pulse is judged against the others, not against an estimate it moves itself: with two or
    three pulses, one held-back pulse drags the whole window's estimate past its healthy neighbour,
    which then looks like its partner (a model run folded a healthy +1.0% with a held-back -9.0% and
    settled "intact" on a 2% loss). Any other lone outlier stays and widens the window's sd. In the
    model with 15% of pulse boundaries holding packets back, 22 of 800 upstream losses settled "intact"
    with the fold judged against the whole window's estimate, 7 of 800 with this one
    (tests/test_incidents.py). These are the gross moves (beyond ``HELD_BACK_Z`` sd); the smaller ones
    are the timing term of :func:`evidence_from`."""
    if len(rows) < 2:
        return list(rows)
    sa = sum(r[0] for r in rows)
    sb = sum(r[1] for r in rows)
    lim = HELD_BACK_Z

    def z(i: int, *without: int) -> float:
        out_a = sum(rows[j][0] for j in (i, *without))
        out_b = sum(rows[j][1] for j in (i, *without))
        return _apart(rows[i], (sa - out_a, sb - out_b))

    out: list[Row] = []
    start = 0
    if before is not None:
        z0 = z(0)
        zb = _apart(before, (sa - rows[0][0], sb - rows[0][1]))
        if min(abs(z0), abs(zb)) > lim and z0 * zb < 0:
            start = 1
    i = start
    while i < len(rows):
        if i + 1 < len(rows):
            zi, zj = z(i, i + 1), z(i + 1, i)
            if min(abs(zi), abs(zj)) > lim and zi * zj < 0:
                out.append(tuple(x + y for x, y in zip(rows[i], rows[i + 1])))
                i += 2
                continue
        if i == len(rows) - 1 and i > start and abs(z(i)) > lim:
            break                                  # the newest pulse waits for its successor
        out.append(rows[i])
        i += 1
    return out


def timing_share2(loss: float) -> float:
    """Variance of the share of a pulse's expected count that one boundary moves, at a loss rate."""
    return TIMING_VAR_PER_LOSS * max(loss, 0.0)


def timing_variance(rows: list[Row], share2: float) -> float:
    """Variance of the window's rate estimate from its pulse boundaries' timing (see the module
    docstring): boundary ``t`` moves ``H_t ~ N(0, share2 e^2)`` packets from pulse ``t`` to pulse
    ``t + 1``, and enters the estimate ``sum a / sum b`` with weight ``(s_t / v_t - s_{t+1} / v_{t+1}) /
    sum b``; with ``e s / v = bg`` of each side's own pulse, over the window's ``n + 1`` boundaries
    (the two edges included). Equal pulses: ``2 share2 (e / s)^2 / n^2``."""
    sb = sum(r[1] for r in rows)
    if sb * sb <= 0:             # no weight (or one so small its square underflows: a hostile verdict file)
        return 0.0
    g = [0.0] + [r[2] for r in rows] + [0.0]
    return share2 * sum((g[i] - g[i + 1]) ** 2 for i in range(len(g) - 1)) / sb ** 2


def pulse_variance(b: float, bg: float, share2: float) -> float:
    """One pulse's variance of its rate ``a / b`` in the verdict's model: its own noise ``1 / b`` and the
    timing of its two boundaries, ``2 share2 (bg / b)^2`` (see :func:`timing_variance`)."""
    return 1.0 / b + 2.0 * share2 * (bg / b) ** 2


def scatter_ratio(chi2: float, n: int) -> float:
    """The window's scatter against the model (Birge ratio ``chi^2 / (n - 1)``), shrunk towards 1 with
    ``SCATTER_PRIOR_DOF`` degrees of freedom; never below 1."""
    return max(1.0, (SCATTER_PRIOR_DOF + chi2) / (SCATTER_PRIOR_DOF + n - 1))


def evidence_from(ledger: Ledger, cell: int, since: float | Sequence[Span], link: str, owner: str, alert_open: bool,
                  loss: float) -> LinkEvidence:
    """The owner's rate estimate over the window and its sd: the model's (the pulses' own noise and the
    window's timing at the asking alert's ``loss`` rate, :func:`timing_variance`), or larger when the
    window's pulses scatter more than the model allows (Birge ratio of the per-pulse rates ``a / b``
    around ``q``, each with its own noise ``1 / b`` and its two boundaries' timing). The timing is the
    fault's, whichever link it is on: the same under both of :func:`settle`'s hypotheses. Pulse
    boundaries on a busy machine hold back a leaf's packets for one or two pulses: per-pulse rates of
    -5.5% and +4.6% around a true 2% (live, allgather, spine1), with a model sd of 1.3% per pulse; a
    window that caught one of them without its return settled "intact" at 100:1 and named a healthy
    link."""
    rows = ledger.window(cell, since)
    n = len(rows)
    sa = sum(r[0] for r in rows)
    sb = sum(r[1] for r in rows)
    if sb <= 0:
        return LinkEvidence(link, owner, 0.0, math.inf, n, alert_open, ledger.reference)
    q = sa / sb
    if ledger.reference is Reference.SPAN:
        # the same packets at both ends: no pulse timing. The scatter is judged against each pulse's null
        # noise plus the loss's own binomial noise at the window's rate (a loss's pulses scatter by it and
        # say nothing against the model); the sd stays the null one: what "no loss here" would give.
        chi2 = sum((a / b - q) ** 2 / (1.0 / b + max(q, 0.0) / max(seg, 1.0)) for a, b, seg in rows)
        return LinkEvidence(link, owner, q, math.sqrt(scatter_ratio(chi2, n) / sb), n, alert_open, ledger.reference,
                            segments=sum(seg for _, _, seg in rows) / n)
    share2 = timing_share2(loss)
    # per pulse: (a/b - q)^2 against 1/b + the timing of its two boundaries, 2 share2 (bg / b)^2
    chi2 = sum((a / b - q) ** 2 / pulse_variance(b, bg, share2) for a, b, bg in rows)
    var = (1.0 / sb + timing_variance(rows, share2)) * scatter_ratio(chi2, n)
    return LinkEvidence(link, owner, q, math.sqrt(var), n, alert_open, ledger.reference)


def path_evidence(ledger: Ledger, cell: int, since: float | Sequence[Span], name: str, owner: str) -> LinkEvidence:
    """A leaf's evidence on a path into it (its same-packet reference, see
    :meth:`agent.detector.switch.SwitchDetector.path_evidence`) from the loss's most likely onset on
    (:meth:`Ledger.onset`, within ``since``'s last span), with that onset as ``start``: the window the
    path's owner and the upstream link's owner are both read over."""
    start = ledger.onset(cell, since)
    if start is not None:
        since = [*spans(since)[:-1], (start, spans(since)[-1][1])]
    ev = evidence_from(ledger, cell, since, name, owner, False, 0.0)
    return dataclasses.replace(ev, start=start)


def sprt_pulses(rate: float, sd: float) -> float:
    """The fewest pulses on average in which any test tells a loss ``rate`` on the owner's link from none
    at :func:`settle`'s odds (wrong either way with probability ``1 / DECIDE_LR``), from per-pulse
    estimates of sd ``sd``: the sequential probability ratio test's expected sample size (Wald's
    approximation, overshoot left out; the same under either hypothesis), which no test with those
    error rates beats on average (Wald and Wolfowitz, 1948). :func:`settle` needs more: it counts the
    leaf's uncertainty, the model error and the window's timing. ``bench/localize.py`` reports it per
    fault: where it exceeds the pulses one iteration after detection gives, nothing that reads the
    owner's evidence localizes that fast but by luck."""
    if rate <= 0 or not sd > 0:
        return math.inf
    alpha = 1.0 / DECIDE_LR
    return (1 - 2 * alpha) * math.log((1 - alpha) / alpha) / (rate * rate / (2 * sd * sd))


def settle(ev: LinkEvidence | None, rate: float, rate_sd: float, min_pulses: int = 2,
           model_error: float = MODEL_ERROR) -> tuple[Verdict, float]:
    """Upstream or downstream for a downstream alert of estimated ``rate`` (sd ``rate_sd``), given the
    owner's evidence since the alert's onset; returns the verdict and the log-likelihood ratio (upstream
    against downstream). ``min_pulses``: the owner's window must hold this many pulses once a pulse
    boundary's timing is taken out (a stall can cut an iteration in two). Three would keep a pulse that
    held back a few percent of its packets (too few to stand ``HELD_BACK_Z`` from its one neighbour)
    from deciding alone: in the model with 15% of pulse boundaries holding packets back, 3 of 800
    upstream losses settled "intact" with three against 7 of 800 with two, both inside the
    1/DECIDE_LR budget; but three costs every verdict a pulse, and the localization sweep named 60 of
    100 faults within one iteration of detection against 80 with two, 12 of 30 at the paper's scale
    against 30 of 30 (tests/test_incidents.py, bench/localize.py)."""
    if ev is None:
        return Verdict.UNJUDGED, 0.0
    if ev.alert_open:
        return Verdict.UPSTREAM, math.inf
    if math.isinf(ev.sd):
        return Verdict.UNJUDGED, 0.0
    if ev.pulses < min_pulses:
        return Verdict.UNDECIDED, 0.0
    p = max(rate, 0.0)
    var_up = ev.sd ** 2 + rate_sd ** 2 + (model_error * p) ** 2
    var_dn = ev.sd ** 2
    mu_dn = min(ev.rate, 0.0)
    llr = (-0.5 * (ev.rate - p) ** 2 / var_up - 0.5 * math.log(var_up)) \
        - (-0.5 * (ev.rate - mu_dn) ** 2 / var_dn - 0.5 * math.log(var_dn))
    lim = math.log(DECIDE_LR)
    if llr > lim:
        return Verdict.UPSTREAM, llr
    if llr < -lim:
        return Verdict.DOWNSTREAM, llr
    return Verdict.UNDECIDED, llr
