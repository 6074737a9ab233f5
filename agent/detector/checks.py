"""The tests a switch runs on its own pulse counts, one class each, behind one interface.

Every check turns a :class:`PulseCounts` into :class:`Samples` over its grid of
cells: per cell the deficit ``r`` (expected minus observed packets), its null
variance form ``u`` (see :mod:`agent.detector.noise`), the deficit one unit of
loss rate would cause ``s``, and whether the cell is judged this pulse. It
names the links a cell's deficit points at (:meth:`suspects`) and may learn
from certified-healthy pulses (:meth:`learn`).

* :class:`PeerCheck` (leaves). Spraying splits the packets from source leaf
  ``a`` to this leaf over the uplinks in known shares ``w_k``; with ``N`` the
  packets from ``a`` on all uplinks in the pulse, ``E c_k = w_k N``. A loss
  ``p`` on the path through spine ``k`` gives ``r_k = p w_k (1 - w_k) N``
  (retransmissions are re-sprayed over all uplinks). Normalised by the pulse's
  own total, it needs no traffic matrix: job size, collective and rank count
  can change freely.
* :class:`SpineCheck` (spines). A spine sees one uplink of each leaf, so it
  compares what leaf ``L`` sent into it with what it forwarded to leaf ``L``:
  in any ring collective (allreduce, allgather, reduce-scatter, DDP), a leaf
  sends into the fabric as many data segments as it receives from it, whatever
  the job. It counts TCP packets with payload only (when the source of counts
  tells them apart): a receiver that loses packets answers with bursts of
  duplicate ACKs, which would otherwise look like its sender receiving more
  than it sends (recorded trace f1_rrdst: 200 extra ACKs per spine in one pulse). With per-(source, destination) spray shares ``W`` through this spine,
  leaf ``L``'s fabric outflow is estimated from the spine's per-destination
  counts of packets from ``L`` (``x``) and its inflow from the per-source
  counts of packets to ``L`` (``y``); a loss ``p`` on ``leafL->spineK``
  lowers ``x`` and leaves ``y``, so ``r = in_L (y / x - 1)``; leaf ``L`` resends
  the lost packets over all spines, a share ``kappa`` (this spine's share of
  its outflow) back through this one, so ``r = p (1 - kappa) expected``: the same
  packets a leaf downstream misses, so the spine's and the leaves' rates agree.
  Ports whose pairs do not all cross this spine (links out of service) are
  not judged. Retransmissions are explained away: a loss anywhere on the way
  from leaf ``a`` to leaf ``Z`` makes ``a`` resend, which raises ``Z``'s
  inflow ``y`` and ``a``'s outflow ``x`` through every spine: a deficit at
  ``Z`` with a matching surplus at a port whose traffic flows *into* ``Z``. A
  real loss on ``leafZ->spineK`` leaves its surplus at the ports ``Z``'s
  traffic flows *to*. So the deficit at ``Z`` is reduced by
  ``sum_a f(a->Z) * surplus_a`` (``f``: the fraction of ``a``'s traffic through
  this spine that goes to ``Z``), and by the retransmissions of leaves further
  up the ring (a leaf that both receives and sends retransmissions shows no
  gap): the least of ``Z``'s gap plus its predecessors' gaps over up to
  ``MAX_HOPS`` hops. A port more than ``GROSS_SHARE`` out of balance in a pulse
  is not in a ring phase (DDP's broadcast) and is not judged. With two leaves
  in the job a port's predecessor is also its successor and the spine cannot
  judge (the leaves' peer test still detects; see docs/concepts/localization.md).
  A deficit must persist: the spine judges each pulse one pulse late and counts
  ``min(r_t, max(r_{t+1}, 0))``, the deficit that the next pulse confirms. A
  real loss is there in every pulse; a stall (an RTO after a loss elsewhere)
  that cuts one iteration into two pulses, or a one-off unbalanced phase (DDP's
  initial parameter broadcast) is not. (Live: a 2% loss on spine3->leaf0 made
  all four spines see leaf1 7-8% short in one pulse and as much over in the
  next; DDP's first pulse left leaf2 13% short at every spine.) It never counts
  more than ``r_t``, so false alarms stay within the budget; it costs about
  0.56 sd of signal per pulse. Jobs whose traffic is unbalanced in every
  pulse (a parameter server, a broadcast loop) break the premise: turn the
  test off with ``spine_test: false``.
* The same-packet reference (counts with sequence spans, :func:`span_samples`): what a port should
  have received of its flows, the spray share of their sequence spans, against the new bytes that came
  in. A spine keeps it per port (``leafA->spineK``), a leaf per (source leaf, uplink) path
  (``leafA->spineK->leafM``). It feeds the owners' verdict ledgers, not the alarms: it also reads a
  loss on the sender's host link, at every spine alike.
* :class:`CorruptionCheck` (every switch). Frames with a broken IPv4 header
  received on a port, against the link's background damaged-frame rate: a
  Poisson CUSUM (:class:`agent.detector.evidence.PoissonCusum`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from agent.detector.alerts import CheckKind
from agent.detector.config import DetectorConfig, Model
from agent.detector.noise import NoiseModel, SpanNoise
from agent.detector.verdict import Ledger, Reference
from agent.pulse import SPAN_BYTES, SPAN_FIRST, SPAN_NEW, SPAN_RESENT, PulseCounts
from netns_testbed.topo import Fabric, Link, SprayMode, node_num

# Theoretical noise factor per spray mode (prior of NoiseModel.phi), and the variance floor.
# random: the multinomial variance itself (recorded traces: 1.01). rrdst: rotation quantisation,
# R (1 - w^2) / 6 per cell for R rotations (rrdst_unit); the traces give 1.0-1.1 x that at R = 2:
# the prior is twice.
# rr: per flow-size class (packets < 4^(b+4)); small flows split almost like random (traces: 0.65
# below 200 packets): prior 1; flows of 1,024 packets and more: 0.0097 in the traces and 0.008-0.013
# in this testbed's live 4 MiB runs: prior 0.03.
RR_CLASSES = 6
RR_PRIOR = [1.0, 1.0, 0.03, 0.03, 0.03, 0.03]
# Spine in/out balance, u = in + expected: random 1 (binomial shares on both sides); rr and rrdst:
# retransmission differences between leaves, 0.041 and 0.028 in the traces: the prior is 0.06.
# Host egress surplus, u = out + mean of the others / (n - 1): spurious retransmission bursts as in the
# spine balance, at any spray mode; the prior is 0.1. The noise is a compound of bursts: most pulses
# differ by 0-2 packets, a few by 40-60 (live, leaf1 -> h2, 2 MiB, busy machine). Learned from the
# quiet stretches the factor fell to 0.012 and one burst in two pulses running was 6 sd, a false
# alert; so the host factor never learns below its prior.
HOST_PRIOR = 0.1
# D-SACKed bytes to segments: a full segment carries the MTU less IPv4 (20), TCP (20) and its timestamp
# option (12) bytes, as Linux sends them.
TCP_IP_HEADERS = 52
HOST_BAND = 0.1
HOST_REPAYS = True    # a host's surplus first repays its shortfall of the pulse before (HostCheck)
HOST_OWED_ALONE = True   # ... also a shortfall in a pulse where one host alone got packets (HostCheck)
# Hosts are not judged in a pulse whose mean per active host is this far below one iteration's (HOST_REFERENCE
# of the last HOST_HISTORY pulses'): an iteration a stall cut short, its peers look in surplus. A leaf-to-host loss
# only adds packets at the leaf, so it never makes a pulse short. bench/host_tails.py on the shipped
# recorded runs: none of 816 pulses of a 204-iteration allreduce, 0-13% of the runs' with faults and stalls
# (11-14% of the emulated guest's).
HOST_SHORT = 0.01
HOST_HISTORY = 15
# ... from the first pulse with a history: a job's first iterations are where stalls split them most
# (a fresh clone's run: an allreduce's 4th iteration cut 4,157/6,065 per host, judged with two pulses
# of history when three were required, raised a false 2.9% alert)
HOST_SHORT_AFTER = 1
# One iteration's mean per active host: this quantile of the last HOST_HISTORY pulses'. Not their median:
# a pulse that holds parts of two iterations (their gap not seen: a slow machine, a short idle) only
# raises it, and on a slow machine such pulses are common. Live (Debian 6.1 in the emulated guest,
# leaf1->h3 at 2%): 6 of the 15 pulses after the onset held 1.4-2.5 iterations, the median rose from
# 10,206 to 10,677 per host and every whole iteration after them (10,300) read short: the host test
# was blind. Cut pulses lower it, but they are rarer (0-14% of a leaf's pulses in the recorded runs,
# bench/host_tails.py): the lower quartile is one iteration while fewer than 4 of 15 pulses are cut,
# however many are merged. A single iteration's mean varies by about 1%, so the quartile is about
# 0.3% below the median of whole iterations. A larger job moves it after 12 pulses, a smaller after 4.
HOST_REFERENCE = 0.25
# Nor are hosts judged in a pulse where every active host got more than HOST_SHORT above one iteration, and
# whose mean differs from the pulse before by more than HOST_SHORT: it holds part of another iteration (a
# head that came early, a tail that came late), and how much of it each host got is timing, not loss. A
# lossy host link only adds packets to its own host; its peers still get one iteration. A job's first
# pulses and a larger job's are like the pulse before from their second (one pulse unjudged, not the 12
# the reference takes to move up). Live (Debian 6.1 in the emulated guest, a 2% drop on leaf1->h3,
# iterations 1.5-2 s apart): after stalls cut three pulses mid-iteration, leaf2's and leaf3's next pulses
# held 1.07 iterations with one host 350 packets ahead of its peer, and 1.04 in the pulse after: false 3%
# alerts on leaf2->h5 and leaf3->h6 whose incidents named those healthy links.
HOST_LONG = True
EXPOSED_Z = 3.0       # a peer cell this far beyond its sd marks its source lossy in the pulse (HostCheck)
VAR_FLOOR = 0.25   # packets^2: no count is known better than to half a packet
# Spine balance. A pair (a, b) is two-way when at least this share of b's packets through the spine
# go back to a: then b is a's successor too, and its gap does not explain a's (a two-leaf job's ring).
# Live rings send 0.3-2.1% the other way (stray segments: allreduce, allgather, reduce_scatter, DDP,
# spine0 of four-leaf runs); 10% keeps them one-way with room.
TWO_WAY_SHARE = 0.1
# A cell more than this share of its expected count out of balance in one pulse is not in a ring
# phase (DDP's parameter broadcast: 127% on a busy machine) and the alarm test does not judge it. The
# CUSUMs are tuned to silent losses (0.25-2%); the leaves' peer test catches a gross loss in one pulse,
# and the verdict ledger still records every pulse (a blackhole is localized by it).
GROSS_SHARE = 0.2
# The owner's same-packet reference (SpineCheck._span): its noise factors' priors (SpanNoise), live
# means over healthy pulses of 4x4x2 rings of 4 MiB (`bench/span_floor.py RUNS`, "noise factors"):
# per segment expected in cells with no resent segment, and per resent segment on top.
# Per spray mode: rrdst the live mean (0.0028); rr the peer test's live factor of large flows (one
# rotation per CPU, the same quantisation); random the multinomial's 1 - w at most.
SPAN_PRIOR_R = 0.03


@dataclass(frozen=True)
class SprayNoise:
    """What a spray mode's split of a source's packets over the uplinks means for the null variance of the
    tests (the comments above give each figure's source). One entry per mode in SPRAY_NOISE."""

    peer_prior: float | list[float]   # the peer test's noise factor; a list: per flow-size class (rr_class)
    spine_prior: float                # the spine balance's
    span_prior: float                 # the same-packet reference's, per segment expected (SPAN_PRIOR_E)
    rotations: bool                   # a round-robin per (CPU, destination): rotation quantisation (rrdst_unit),
                                      # not the multinomial w (1 - w) n

    @property
    def size_classes(self) -> bool:
        return isinstance(self.peer_prior, list)


SPRAY_NOISE = {
    SprayMode.RANDOM: SprayNoise(peer_prior=1.0, spine_prior=1.0, span_prior=1.0, rotations=False),
    SprayMode.RR: SprayNoise(peer_prior=RR_PRIOR, spine_prior=0.06, span_prior=0.03, rotations=False),
    SprayMode.RRDST: SprayNoise(peer_prior=2.0, spine_prior=0.06, span_prior=0.0028, rotations=True),
}
SPAN_PRIOR_E = {mode: n.span_prior for mode, n in SPRAY_NOISE.items()}
BALANCE, SPAN = Reference.BALANCE, Reference.SPAN
# The alarm's explain-away walks at most this many predecessors back (two retransmitting leaves in a
# row; each hop adds a gap's noise to the partial sums whose least it takes).
MAX_HOPS = 3


def rr_class(n: np.ndarray | float) -> np.ndarray:
    """Flow-size class of round-robin noise: flows of fewer than 4^(b + 4) packets are class b."""
    return np.clip(np.floor(np.log(np.maximum(n, 1.0)) / np.log(4.0)) - 3, 0, RR_CLASSES - 1).astype(int)


def rrdst_unit(w: np.ndarray, rotations: int) -> np.ndarray:
    """Variance form of rrdst's rotation quantisation for a port with share w.

    Each rotation hands a chunk of c packets to k ports in turn: every port gets floor(c/k), and the
    remainder e < k goes one each to the next e ports. A port's deviation from c/k is f or f - 1
    with f = e/k, variance f (1 - f); over a remainder spread evenly that is (1 - 1/k^2) / 6 (about
    1/6 whatever k). With w = 1/k: (1 - w^2) / 6 per rotation. (w (1 - w), the multinomial's form,
    is close at 4 spines and 11 times too small at 64.)
    """
    return rotations * (1.0 - w * w) / 6.0


def peer_prior(spray: SprayMode, n: float) -> float:
    """The prior noise factor of a peer cell of a flow of n packets."""
    noise = SPRAY_NOISE[spray]
    return float(noise.peer_prior[int(rr_class(n))]) if noise.size_classes else float(noise.peer_prior)


@dataclass
class Samples:
    r: np.ndarray          # deficit, packets
    u: np.ndarray          # variance form (V = phi u)
    s: np.ndarray          # deficit per unit loss rate
    mask: np.ndarray       # cell judged this pulse
    expected: np.ndarray
    observed: np.ndarray
    cls: np.ndarray | int = 0   # noise class per cell (see NoiseModel)
    start_time: float | None = None  # of the pulse these samples judge (the spine judges one pulse late)
    raw: np.ndarray | None = None    # the deficits before the next pulse confirmed them (see confirmed)
    path: "Samples | None" = None    # the same pulse's same-packet reference (a leaf's paths, a spine's ports)


def confirmed(prev: Samples | None, cur: Samples, shape: tuple) -> Samples:
    """``prev``'s samples with each deficit cut to what the next pulse (``cur``) confirms:
    ``min(r_t, max(r_t+1, 0))``. A real loss is there in every pulse; a stall that cuts one iteration
    into two pulses moves packets from one to the other and is not. Nothing to judge before the first
    pulse has a successor."""
    if prev is None:
        z = np.zeros(shape)
        return Samples(z, np.ones(shape), z, np.zeros(shape, bool), z, z)
    nxt = np.where(cur.mask, cur.r, 0.0)
    r = np.where(prev.r > 0, np.minimum(prev.r, np.maximum(nxt, 0.0)), prev.r)
    return Samples(r, prev.u, prev.s, prev.mask, prev.expected, prev.observed, start_time=prev.start_time,
                   raw=prev.r)


class ResentLevel:
    """Per cell the usual number of resent segments, for the variance the verdict ledger weighs a pulse
    with. The alarms weigh each pulse by its own resent segments (a burst of them is noise a CUSUM must
    not read as a loss); a rate estimate must not: a loss's own retransmissions are resent segments of
    the same pulse, so a pulse that lost more would weigh less, and the estimate reads low (the model,
    a 0.53% drop on a 4 MiB ring at 4x4x1: 0.28% over the fault's first 7 pulses). The ledger takes the
    cell's level before this pulse instead: an average over about ``1 / ALPHA`` pulses, which follows a
    lasting loss's retransmissions without following any one pulse's."""

    ALPHA = 0.2

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.level = np.zeros(shape)
        self.seen = np.zeros(shape, dtype=bool)

    def weights(self, u: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``u`` = (expected, resent) per cell with the resent segments replaced by the level before this
        pulse (this pulse's own where there is none yet); then the level takes this pulse in."""
        R = u[..., 1]
        out = np.stack([u[..., 0], np.where(self.seen, self.level, R)], axis=-1)
        self.level = np.where(mask, np.where(self.seen, (1 - self.ALPHA) * self.level + self.ALPHA * R, R), self.level)
        self.seen |= mask
        return out

    def state(self) -> dict:
        return {"level": self.level.tolist(), "seen": self.seen.tolist()}

    def load(self, d: dict | None) -> None:
        if d:
            self.level = np.asarray(d["level"], dtype=float).reshape(self.level.shape)
            self.seen = np.asarray(d["seen"], dtype=bool).reshape(self.seen.shape)


def path_name(source: int, spine: int, leaf: str) -> str:
    """A leaf's path into it from a source leaf through a spine: ``leafA->spineK->leafM``."""
    return f"leaf{source}->spine{spine}->{leaf}"


def span_samples(sp: np.ndarray, share: np.ndarray | None, judged: np.ndarray, min_pkts: float,
                 expected_bytes: np.ndarray | None = None, seg_unseen: np.ndarray | None = None) -> Samples:
    """The same-packet reference over cells (bpf/switch.h, struct fp_span): ``sp[..., field]`` the span
    sums of each cell, ``share`` the spray share of its flows that should cross it (or
    ``expected_bytes`` given). What should have come in, the share of the flows' sequence spans, against
    the new bytes that did, in segments of the cell's mean size: ``r = e - observed``, ``s = e`` (a loss
    p takes p of them), ``u = (e, resent)`` (:class:`agent.detector.noise.SpanNoise`). A cell is judged
    with at least ``min_pkts`` segments expected and seen.

    ``seg_unseen``: the segment size (bytes) of cells that saw fewer than ``min_pkts`` new segments,
    which are then judged on the segments expected alone. A spine's cell of one destination leaf has
    its spans from the flows' ACKs too (bpf/switch.c, track_ack): a flow whose every segment into the
    port is lost (a flow-selective blackhole) has a span there and no segment to measure its size by;
    the port's mean segment over all its cells stands in."""
    sp = sp.astype(float)
    new_b, first, resent = sp[..., SPAN_NEW], sp[..., SPAN_FIRST], sp[..., SPAN_RESENT]
    exp_b = share * sp[..., SPAN_BYTES] if expected_bytes is None else expected_bytes
    seg = np.divide(new_b, first, out=np.ones_like(new_b), where=first > 0)   # the cell's mean segment, bytes
    seen = first >= min_pkts
    if seg_unseen is not None:
        seg = np.where(seen, seg, np.maximum(np.broadcast_to(seg_unseen, seg.shape), 1.0))
        seen = np.ones_like(seen)
    e, obs = exp_b / seg, new_b / seg
    mask = judged & seen & (e >= min_pkts)
    u = np.stack([np.where(mask, e, 1.0), np.where(mask, resent, 0.0)], axis=-1)
    return Samples(np.where(mask, e - obs, 0.0), u, np.where(mask, e, 0.0), mask, e, obs)


@dataclass(frozen=True)
class Suspect:
    """What one cell's deficit points at."""

    port: int
    direction: str               # "in": the link into this switch on that port
    source: str | None           # source leaf of the traffic, if the cell is per source
    link: Link | None            # the one link, when the cell alone decides it
    candidates: tuple[Link, ...]


Finding = tuple[tuple, float, float]   # (cell, rate, z): shares measured at start that contradict the model


@runtime_checkable
class Check(Protocol):
    """What the switch detector asks of each test whose cells feed a CUSUM bank (PeerCheck,
    TotalsPeerCheck, SpineCheck, HostCheck). Damaged frames are counted, not sampled: CorruptionCheck
    feeds the Poisson CUSUM and gives only ``suspects``."""

    kind: CheckKind
    shape: tuple[int, ...]                 # the cells
    port_of_cell: np.ndarray               # each cell's port (scores per port)

    def samples(self, pc: PulseCounts) -> Samples:
        """This pulse's deficit, variance form and signal per unit loss rate for every cell."""

    def suspects(self, idx: tuple) -> Suspect:
        """What a cell's deficit points at."""

    def set_shares(self, weights: dict[str, float], oos: Sequence[Link]) -> None:
        """The leaves spray with these weights and these links out of service from now on."""

    def forget_held(self) -> None:
        """A pulse was not judged: nothing carried over from the one before it."""

    def learn(self, smp: Samples) -> None:
        """Refine what is learned from a certified-healthy pulse's samples."""

    def take_findings(self) -> list[Finding]:
        """What the check found outside its CUSUMs since it was last asked (asymmetry at start)."""

    def state(self) -> dict: ...

    def load(self, d: dict) -> None: ...


class PeerCheck:
    kind = CheckKind.PEER

    def __init__(self, fabric: Fabric, switch: str, spray: SprayMode, cfg: DetectorConfig,
                 weights: dict[str, float], oos: list[Link], degraded: set[str]) -> None:
        self.fabric, self.switch, self.spray, self.cfg = fabric, switch, spray, cfg
        L, S = fabric.spec.leaves, fabric.spec.spines
        self.S, self.L = S, L
        self.degraded = degraded
        self.set_shares(weights, oos)
        self.shape = (L, S)
        self.port_of_cell = np.broadcast_to(np.arange(S), self.shape)   # uplink k is port k
        self.spray_noise = SPRAY_NOISE[spray]
        self.noise = NoiseModel(self.spray_noise.peer_prior, cfg.prior_dof, VAR_FLOOR)
        self.rot = cfg.rotations_or_cpus
        # learned model: per source, packets per uplink and in total, and pulses measured
        self.learn_c = np.zeros((L, S))
        self.learn_n = np.zeros(L)
        self.learn_pulses = np.zeros(L, dtype=np.int64)
        self.findings: list[Finding] = []   # asymmetry at start (take_findings)
        self.last: Samples | None = None
        # The leaf's own evidence on the paths into it (counts with sequence spans): per (source leaf a,
        # uplink k) the spray share of a's flows' spans through spine k against the new bytes that came in
        # on uplink k. A loss on ``leafa->spinek`` or on ``spinek->thisleaf`` reads the same here; spine
        # k's own reference tells the two apart (agent.incidents settles an ambiguous alert with both).
        self.path_noise = SpanNoise(self.spray_noise.span_prior, SPAN_PRIOR_R, cfg.prior_dof, VAR_FLOOR)
        self.path_ledger = Ledger(L * S, reference=SPAN)           # cell a * S + k
        self.path_resent = ResentLevel((L, S))

    def set_shares(self, weights: dict[str, float], oos: Sequence[Link]) -> None:
        """The spray shares of each source leaf's traffic to this leaf over the spines, from the fabric
        model with ``oos`` out of service: at start, and when a drain or a restore changes them
        (:meth:`agent.detector.SwitchDetector.reshare`; what was learned stays, except shares the
        learned model measured from sources whose shares changed)."""
        L, S, switch = self.L, self.S, self.switch
        me = node_num(switch)
        w = np.zeros((L, S))
        for a in range(L):
            if a == me:
                continue
            shares = self.fabric.spray_shares(f"leaf{a}", switch, weights, oos)
            for k in range(S):
                if f"spine{k}" in shares and f"spine{k}->{switch}" not in self.degraded \
                        and f"leaf{a}->spine{k}" not in self.degraded:
                    w[a, k] = shares[f"spine{k}"]
        old = getattr(self, "w_model", None)
        self.usable = w > 0
        self.valid = self.usable.sum(axis=1) >= 2
        tot = w.sum(axis=1, keepdims=True)
        self.w_model = np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)
        self.w_path = w                                            # share of a's traffic through spine k
        if old is not None and old.shape == self.w_model.shape:
            moved = ~np.isclose(old, self.w_model).all(axis=1)
            self.learn_c[moved] = 0.0
            self.learn_n[moved] = 0.0
            self.learn_pulses[moved] = 0

    def forget_held(self) -> None:
        """A pulse was not judged (a spray change crossed it): the next one has no predecessor."""
        self.last = None

    def shares(self) -> np.ndarray:
        if self.cfg.model is Model.ANALYTIC:
            return self.w_model
        n = self.learn_n[:, None]
        learned = np.divide(self.learn_c, n, out=self.w_model.copy(), where=n > 0)
        return learned

    per_source = True
    sources_per_cell = 1   # source leaves whose traffic one cell adds up (their rotation noises add)

    def counts(self, pc: PulseCounts) -> np.ndarray:
        """Packets received per (source leaf, uplink) in the pulse."""
        return pc.ip[:self.S, 0, 1:self.L + 1].T.astype(float) * self.usable

    def samples(self, pc: PulseCounts) -> Samples:
        c = self.counts(pc)
        n = c.sum(axis=1, keepdims=True)
        ready = self.valid & (n[:, 0] >= self.cfg.min_cell_pkts)
        if self.cfg.model is Model.LEARNED:
            ready = self._learning(c, n[:, 0], ready)
        w = self.shares()
        wq = w * (1.0 - w)
        s = wq * n
        u = rrdst_unit(w, self.rot) * self.sources_per_cell if self.spray_noise.rotations else s
        mask = self.usable & ready[:, None] & (wq > 0)
        u = np.where(mask, u, 1.0)
        cls = 0
        if self.spray_noise.size_classes:
            cls = np.broadcast_to(rr_class(n), self.shape)
        self.last = Samples(w * n - c, u, s, mask, w * n, c, cls)
        if pc.span is not None:
            path = span_samples(pc.span[:self.S, 1:self.L + 1, :].transpose(1, 0, 2), self.w_path,
                                self.usable, self.cfg.min_cell_pkts)
            v = self.path_noise.variance(self.path_resent.weights(path.u, path.mask))
            self.path_ledger.add(pc.start_time, path.r.ravel(), v.ravel(), path.s.ravel(), np.zeros(path.r.size),
                                 path.mask.ravel())
            self.last.path = path
        return self.last

    def path_cell(self, source: int, spine: int) -> int:
        """The path ledger's cell of ``leaf<source>->spine<spine>->`` this leaf."""
        return source * self.S + spine

    def _learning(self, c: np.ndarray, n: np.ndarray, ready: np.ndarray) -> np.ndarray:
        """Learned model: a source's first ``learn_pulses`` pulses measure its shares (not judged)."""
        young = ready & (self.learn_pulses < self.cfg.learn_pulses)
        for a in np.flatnonzero(young):
            self.learn_c[a] += c[a]
            self.learn_n[a] += n[a]
            self.learn_pulses[a] += 1
            if self.learn_pulses[a] == self.cfg.learn_pulses:
                self._compare_with_model(a)
        return ready & ~young

    def _compare_with_model(self, a: int) -> None:
        """Shares measured at start against the analytic ones: a deficit is reported, not accepted silently."""
        wm = self.w_model[a]
        n = self.learn_n[a]
        wq = wm * (1 - wm)
        deficit = wm * n - self.learn_c[a]
        u = rrdst_unit(wm, self.rot) * self.cfg.learn_pulses if self.spray_noise.rotations else wq * n
        var = self.noise.variance(u, rr_class(n / self.cfg.learn_pulses) if self.spray_noise.size_classes else 0)
        z = deficit / np.sqrt(var)
        for k in np.flatnonzero(self.usable[a]):
            rate = deficit[k] / (wq[k] * n) if wq[k] * n > 0 else 0.0
            self.findings.append(((a, int(k)), float(rate), float(z[k])))

    def take_findings(self) -> list[Finding]:
        found, self.findings = self.findings, []
        return found

    def learn(self, smp: Samples) -> None:
        if smp.path is not None:
            self.path_noise.learn(*self.path_noise.sample(smp.path.r, smp.path.u, smp.path.mask))
        if self.cfg.model is Model.LEARNED:
            rows = smp.mask.any(axis=1)
            self.learn_c[rows] += smp.observed[rows]
            self.learn_n[rows] += smp.observed[rows].sum(axis=1)

    def suspects(self, idx: tuple) -> Suspect:
        a, k = idx
        down = Link(f"spine{k}", self.switch)
        up = Link(f"leaf{a}", f"spine{k}")
        return Suspect(k, "in", f"leaf{a}", None, (down, up))

    def state(self) -> dict:
        return {"learn_c": self.learn_c.tolist(), "learn_n": self.learn_n.tolist(),
                "learn_pulses": self.learn_pulses.tolist(), "path_ledger": self.path_ledger.state(),
                "path_noise": self.path_noise.state(), "path_resent": self.path_resent.state()}

    def load(self, d: dict) -> None:
        self.learn_c = np.asarray(d["learn_c"], dtype=float).reshape(self.learn_c.shape)
        self.learn_n = np.asarray(d["learn_n"], dtype=float).reshape(self.learn_n.shape)
        self.learn_pulses = np.asarray(d["learn_pulses"], dtype=np.int64).reshape(self.learn_pulses.shape)
        self.path_ledger.load(d.get("path_ledger", []))
        if "path_noise" in d:
            self.path_noise.load(d["path_noise"])
        self.path_resent.load(d.get("path_resent"))


class TotalsPeerCheck(PeerCheck):
    """Leaves, from per-port totals (interface statistics: no split by source leaf).

    The packets an uplink receives from all source leaves together are one cell per uplink. Their
    expected share is a source's share when every source leaf sprays over this leaf's uplinks alike
    (no links out of service, no weights, nothing degraded): checked here, else no test can be made
    from totals and the site is refused. A deficit on uplink ``k`` points at ``spine_k->this leaf``
    or at any ``leafX->spine_k``: which, only a spine with a per-source split could tell. Under rrdst
    each source's rotation noise adds: ``sources_per_cell`` times one source's.
    """

    kind = CheckKind.PEER
    per_source = False

    def __init__(self, fabric: Fabric, switch: str, spray: SprayMode, cfg: DetectorConfig,
                 weights: dict[str, float], oos: list[Link], degraded: set[str]) -> None:
        super().__init__(fabric, switch, spray, cfg, weights, oos, degraded)
        if self.sources and not self.uniform:
            from netns_testbed.errors import SpecError

            raise SpecError(f"{switch}: interface statistics have no per-source split, so every leaf must spray "
                            "over its uplinks alike: no links out of service, weights or degraded links "
                            "(use the ebpf counters for those)")
        self.shape = (1, self.S)
        self.port_of_cell = np.arange(self.S)[None, :]
        self.learn_c = np.zeros((1, self.S))
        self.learn_n = np.zeros(1)
        self.learn_pulses = np.zeros(1, dtype=np.int64)

    def set_shares(self, weights: dict[str, float], oos: Sequence[Link]) -> None:
        """As a source leaf's, when every source sprays alike; a drain that breaks that leaves no test
        (every cell unusable) until a restore brings it back."""
        old = getattr(self, "w_model", None)
        super().set_shares(weights, oos)
        me = node_num(self.switch)
        rows = [a for a in range(self.L) if a != me]
        self.uniform = bool(rows) and bool(self.valid[rows].all()) and \
            all(np.allclose(self.w_model[a], self.w_model[rows[0]]) for a in rows)
        first = rows[0] if rows else me
        self.sources = rows
        self.sources_per_cell = max(1, len(rows))
        self.w_model = self.w_model[first][None, :]
        self.w_path = self.w_path[first][None, :]
        self.usable = self.usable[first][None, :] if self.uniform else np.zeros((1, self.S), bool)
        self.valid = np.array([self.uniform])
        if old is not None and not np.allclose(old, self.w_model):
            self.learn_c[:] = 0.0
            self.learn_n[:] = 0.0
            self.learn_pulses[:] = 0

    def counts(self, pc: PulseCounts) -> np.ndarray:
        return pc.ip[:self.S, 0, :].sum(axis=1)[None, :].astype(float) * self.usable

    def suspects(self, idx: tuple) -> Suspect:
        _, k = idx
        down = Link(f"spine{k}", self.switch)
        return Suspect(k, "in", None, None, (down,) + tuple(Link(f"leaf{a}", f"spine{k}") for a in self.sources))


class SpineCheck:
    kind = CheckKind.SPINE

    def __init__(self, fabric: Fabric, switch: str, spray: SprayMode, cfg: DetectorConfig,
                 weights: dict[str, float], oos: list[Link], degraded: set[str]) -> None:
        self.fabric, self.switch, self.cfg = fabric, switch, cfg
        self.L = L = fabric.spec.leaves
        self.degraded = degraded
        self.set_shares(weights, oos)
        self.shape = (L,)
        self.port_of_cell = np.arange(L)                                # port a faces leaf a
        self._held: Samples | None = None                               # the pulse waiting for its successor
        self.noise = NoiseModel(SPRAY_NOISE[spray].spine_prior, cfg.prior_dof, VAR_FLOOR)
        self.span_noise = SpanNoise(SPRAY_NOISE[spray].span_prior, SPAN_PRIOR_R, cfg.prior_dof, VAR_FLOOR)
        # the owner's verdict evidence: per port (cell a, see owned_cell), then per port and destination
        # leaf (cell L + a L + b, see path_cell; the same-packet reference only)
        self.ledger = Ledger(L + L * L, reference=BALANCE)
        self.resent = ResentLevel((L,))
        self.path_resent = ResentLevel((L, L))

    def set_shares(self, weights: dict[str, float], oos: Sequence[Link]) -> None:
        """The share of each leaf pair's traffic that crosses this spine, and the ports it can judge, with
        ``oos`` out of service (at start, and at a drain or a restore)."""
        L, switch = self.L, self.switch
        wk = np.zeros((L, L))             # share of a->b traffic that crosses this spine
        for a in range(L):
            for b in range(L):
                if a != b:
                    wk[a, b] = self.fabric.spray_shares(f"leaf{a}", f"leaf{b}", weights, oos).get(switch, 0.0)
        self.wk = wk
        off = ~np.eye(L, dtype=bool)
        names_ok = np.array([f"leaf{x}->{switch}" not in self.degraded and f"{switch}->leaf{x}" not in self.degraded
                             for x in range(L)])
        # every pair into and out of leaf x must cross this spine for the balance to hold
        self.judged = names_ok & np.array([(wk[x][off[x]] > 0).all() and (wk[:, x][off[:, x]] > 0).all()
                                           for x in range(L)])
        # the reference needs only some of leaf x's traffic to cross this spine (its flows' spans say how much)
        self.span_judged = names_ok & (wk.sum(axis=1) > 0)
        self.inv_out = np.divide(1.0, wk, out=np.zeros_like(wk), where=wk > 0)  # [a, b]

    def forget_held(self) -> None:
        """A pulse was not judged (a spray change crossed it): the held one has no successor to confirm it."""
        self._held = None

    @property
    def reference(self) -> Reference:
        """What this spine's verdicts judge by: the same-packet reference once its counts carry sequence
        spans (the first pulse says), the balance before."""
        return self.ledger.reference

    def samples(self, pc: PulseCounts) -> Samples:
        """The previous pulse's balance, its deficits as far as this pulse confirms them (the alarm).

        The verdict ledger takes the same-packet reference when the counts carry sequence spans, the
        balance otherwise. The reference does not alarm: it reads a loss anywhere before this spine,
        the sender's host link included (a segment lost there is spanned, and its retransmission comes
        in as resent), the same at every spine; what names ``leafA->spineK`` alone must not move with
        that. A leaf's alert on one uplink asks for it, with its own path's evidence beside it
        (agent.incidents)."""
        L2 = self.L * self.L
        if pc.span is not None:
            self.ledger.reference = SPAN
            ref, dest = self._span(pc)
            v = self.span_noise.variance(self.resent.weights(ref.u, ref.mask))
            vd = self.span_noise.variance(self.path_resent.weights(dest.u, dest.mask))
            self.ledger.add(pc.start_time, np.concatenate([ref.r, dest.r.ravel()]), np.concatenate([v, vd.ravel()]),
                            np.concatenate([ref.s, dest.s.ravel()]), np.zeros(self.L + L2),
                            np.concatenate([ref.mask, dest.mask.ravel()]))
        cur, r_own, u_own, counted = self._balance(pc)
        cur.start_time = pc.start_time
        if pc.span is None:
            z = np.zeros(L2)
            self.ledger.add(pc.start_time, np.concatenate([r_own, z]), np.concatenate([self.noise.variance(u_own), z + 1]),
                            np.concatenate([cur.s, z]), np.concatenate([cur.expected, z]),
                            np.concatenate([counted, np.zeros(L2, bool)]))
        else:
            cur.path = ref
        prev, self._held = self._held, cur
        out = confirmed(prev, cur, self.shape)
        out.path = prev.path if prev is not None else None
        return out

    def _balance(self, pc: PulseCounts) -> tuple[Samples, np.ndarray, np.ndarray, np.ndarray]:
        """One pulse's balance per port, retransmissions explained away (judged a pulse later), and the
        per-pulse deficit the owner's verdicts use (see :mod:`agent.detector.verdict`): its value, its
        variance form and the cells it counts in."""
        L = self.L
        counts = pc.data if pc.data is not None else pc.ip
        out = counts[:L, 1, 1:L + 1].astype(float)  # [port b (dest leaf), source a]
        sent = out.T                                 # [a, b]: packets from leaf a forwarded to leaf b
        inn = sent.sum(axis=1)                       # packets from leaf a through this spine
        x = (sent * self.inv_out).sum(axis=1)        # leaf a's fabric outflow, estimated
        y = (sent * self.inv_out).sum(axis=0)        # leaf b's fabric inflow, estimated
        kappa = np.divide(inn, x, out=np.zeros(L), where=x > 0)
        expected = kappa * y
        mask = self.judged & (inn >= self.cfg.min_cell_pkts) & (expected >= self.cfg.min_cell_pkts)
        u = np.where(mask, inn + expected, 1.0)
        # a loss p on leafb->spineK loses p * inn; leaf b resends them over all spines, a share kappa
        # through this one: the deficit is p * inn * (1 - kappa), the same packets the leaves miss
        s = expected * (1.0 - np.minimum(kappa, 1.0))
        # a deficit at b, less the surplus of the ports whose traffic flows into b (retransmissions)
        gap = expected - inn
        frac = np.divide(sent, inn[:, None], out=np.zeros_like(sent), where=inn[:, None] > 0)   # f(a->b)
        surplus = np.where(mask, np.maximum(0.0, -gap), 0.0)
        resent = frac.T @ surplus
        explained = gap - np.minimum(gap, resent)
        one_way = frac * (frac.T < TWO_WAY_SHARE)
        # A leaf that receives retransmissions and resends its own shows no gap, and the one-hop rule
        # above misses the chain: live (DDP, 2% drops on leaf2->spine1 and spine3->leaf0), spine3 saw
        # gaps [+25, 0, -27, 0]: leaf1 resending to leaf0 what spine3->leaf0 lost, leaf2 resending to
        # leaf1, and leaf0's 0.6% "deficit" alarmed after 15 pulses. Walking the predecessors back,
        # b's gap plus theirs (telescoping: b's deficit against the retransmissions of the leaf k hops
        # up), the least of these partial sums is what no upstream leaf's resending explains. Up to
        # MAX_HOPS hops and never round to b's successor (the whole ring sums to zero).
        g = np.where(mask, gap, 0.0)
        walk = g.copy()
        for _ in range(min(MAX_HOPS, int(mask.sum()) - 2)):
            walk = g + one_way.T @ walk
            explained = np.minimum(explained, walk)
        r = np.where(gap > 0, np.maximum(explained, 0.0), gap)
        # Verdicts (an upstream or a downstream loss for a leaf's alert?) need an unbiased estimate, so
        # they explain retransmissions away linearly: b's gap plus its predecessors' gaps, each
        # weighted by the share of its traffic that goes to b. Retransmissions towards b (a surplus at
        # a, a deficit at b) then cancel exactly, a noise surplus takes nothing off on average (the
        # clipped version of the alarm test takes its half-normal mean, 0.4 sd, and biased verdicts
        # towards "intact"; clipping beyond 2 sd left a spurious deficit in every retransmission burst),
        # and the variance is the sum. Only predecessors that are not also b's successors count (less
        # than TWO_WAY_SHARE of b's packets go back to them; stray segments in the other direction made
        # an exact "no packet back" rule count no predecessor at all, and a 2% loss on spine3->leaf0
        # under allgather got leaf3->spine3 named from leaf2's retransmissions): with two leaves in the
        # job each is the other's both, and a loss downstream of b shows as b's surplus.
        r_own = gap + one_way.T @ g
        u_own = np.where(mask, u + (one_way ** 2).T @ np.where(mask, u, 0.0), 1.0)
        ring = mask & (np.abs(gap) <= GROSS_SHARE * np.maximum(expected, inn))
        return Samples(r, u, s, ring, expected, inn), r_own, u_own, mask

    def _span(self, pc: PulseCounts) -> tuple[Samples, Samples]:
        """The same-packet reference per port (bpf/switch.h, struct fp_span): what leaf a's flows through
        this spine should have brought, the spray share of their sequence spans per destination leaf,
        against the new bytes that came in on port a, in segments of the port's mean size. A loss p on
        ``leafa->spineK`` takes p of the port's segments out of the new bytes and nothing out of the spans:
        ``r = p e`` with ``e`` the segments expected, whatever the workload, the pulse's timing or the
        retransmissions (which are told apart by sequence). The rate is the link's own: a leaf
        downstream sees the same segments missing. No confirmation by the next pulse: a stall that cuts
        an iteration moves spans and new bytes together.

        Second, the same per port and destination leaf b: the packets a leaf's path evidence counts
        (``leafa->spineK->leafb``, the same flows), which a verdict on that leaf's alert reads. A fault
        that takes only some flows (a flow-selective blackhole) can leave the port's sum nearly whole
        while the flows towards b lose all their segments here; their spans still come from the ACKs
        (bpf/switch.c, track_ack), sized by the port's mean segment (:func:`span_samples`)."""
        L = self.L
        sp = pc.span[:L, 1:L + 1, :].astype(float)          # [port a, destination leaf b, field]
        port = sp.sum(axis=1, keepdims=True)
        smp = span_samples(port, None, self.span_judged[:, None], self.cfg.min_cell_pkts,
                           expected_bytes=(self.wk * sp[:, :, SPAN_BYTES]).sum(axis=1, keepdims=True))
        seg = np.divide(port[..., SPAN_NEW], port[..., SPAN_FIRST], out=np.zeros((L, 1)), where=port[..., SPAN_FIRST] > 0)
        dest = span_samples(sp, self.wk, self.span_judged[:, None] & (self.wk > 0), self.cfg.min_cell_pkts,
                            seg_unseen=np.where(seg > 0, seg, np.inf))
        return (Samples(smp.r[:, 0], smp.u[:, 0], smp.s[:, 0], smp.mask[:, 0], smp.expected[:, 0],
                        smp.observed[:, 0], start_time=pc.start_time), dest)

    def take_findings(self) -> list[Finding]:
        return []

    def learn(self, smp: Samples) -> None:
        if smp.path is not None:
            self.span_noise.learn(*self.span_noise.sample(smp.path.r, smp.path.u, smp.path.mask))

    def suspects(self, idx: tuple) -> Suspect:
        (a,) = idx
        link = Link(f"leaf{a}", self.switch)
        return Suspect(a, "in", f"leaf{a}", link, (link,))

    def owned_cell(self, link: Link) -> int | None:
        """The cell that judges ``link`` (this spine's port from a leaf), if any."""
        if link.dst != self.switch or not link.src.startswith("leaf"):
            return None
        return node_num(link.src)

    def path_cell(self, source: int, dest: int) -> int | None:
        """The cell that judges ``leaf<source>->``this spine for the flows towards ``leaf<dest>`` (see
        :meth:`_span`), if any: the same packets as that leaf's path evidence."""
        if not (self.span_judged[source] and self.wk[source, dest] > 0):
            return None
        return self.L + source * self.L + dest

    def state(self) -> dict:
        return {"ledger": self.ledger.state(), "reference": str(self.reference), "resent": self.resent.state(),
                "path_resent": self.path_resent.state(), "span_noise": self.span_noise.state()}

    def load(self, d: dict) -> None:
        self.ledger.load(d.get("ledger", []))
        self.ledger.reference = Reference(d.get("reference", str(BALANCE)))
        self.resent.load(d.get("resent"))
        self.path_resent.load(d.get("path_resent"))
        if "span_noise" in d:
            self.span_noise.load(d["span_noise"])


def host_delivered(pc: PulseCounts, S: int, H: int, mss: float) -> np.ndarray:
    """Per host of a leaf (ports ``S..S+H``): the data packets the leaf sent it in ``pc``, less the
    segments the host reported with a D-SACK (it got them twice: no loss; reordered copies resent
    spuriously: live, 250 packets to one host in one pulse of a healthy 8 MiB allreduce)."""
    counts = pc.data if pc.data is not None else pc.ip
    obs = counts[S:S + H, 1, :].sum(axis=1).astype(float)
    if pc.dup is not None:
        obs = obs - np.minimum(pc.dup[S:S + H, 0, 1] / mss, obs)
    return obs


def busy_hosts(obs: np.ndarray, min_cell_pkts: int) -> np.ndarray:
    """The hosts in the job this pulse: at least a quarter of the busiest one's packets."""
    return obs >= max(min_cell_pkts, 0.25 * float(obs.max(initial=0.0)))


def peer_gap(obs: np.ndarray, among: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per host: the mean of the other hosts in ``among`` (at least two), and its shortfall against
    that mean (<= 0; 0 for a host outside ``among``)."""
    others = (obs[among].sum() - obs) / (int(among.sum()) - 1)
    return others, np.where(among, np.minimum(obs - others, 0.0), 0.0)


class HostCheck:
    """Leaves: packets sent to each host against its peer hosts on the same leaf (``leafM->hN``).

    A loss on ``leafM->hN`` happens after the leaf counted the packet; the sender resends it, and the
    leaf counts it again: a surplus ``p N`` on that host's port. In ring collectives, allgather,
    reduce-scatter and DDP every rank receives as many data packets as its peers, so each active
    host port is compared with the mean of the other active ones on this leaf (a host port is active
    with at least a quarter of the busiest one's packets: hosts outside the job drop out). Fabric
    losses also bring retransmissions to the hosts behind them: the leaf's own peer test tells how
    many packets each source leaf lost on the way here (its uplink deficits beyond two standard
    deviations, divided by ``1 - w``), and they are taken off each host port in proportion to that
    source's traffic to it. Like the spine's, the surplus must be confirmed by the next pulse, it first
    repays the host's shortfall of the pulse before (an iteration's tail moved on by a stall), and a
    host more than 10% apart from its peers in a pulse is not judged in it (see ``_surplus``). Jobs
    whose ranks receive unequal volumes every pulse break the premise: ``host_test: false``.

    A surplus is also what lost ACKs on the way back cause (the senders resend), so an alert names
    ``leafM->hN`` together with this leaf's uplinks; the uplinks' owners (the spines) settle it (see
    :mod:`agent.incidents`). A loss on ``hN->leafM`` is not visible as such in any switch's packet
    counts: it happens before the leaf counts, and the host's retransmission is counted once, as the
    packet would have been (only the spurious retransmissions that follow show, at the receivers).
    """

    kind = CheckKind.HOST

    def __init__(self, fabric: Fabric, switch: str, cfg: DetectorConfig, degraded: set[str],
                 peer: PeerCheck) -> None:
        self.fabric, self.switch, self.cfg, self.peer = fabric, switch, cfg, peer
        self.S, self.H = fabric.spec.spines, fabric.spec.hosts_per_leaf
        self.hosts = fabric.leaf_hosts(switch)
        self.shape = (self.H,)
        self.port_of_cell = self.S + np.arange(self.H)
        self.judged = np.array([f"{switch}->{h}" not in degraded for h in self.hosts])
        self.noise = NoiseModel(HOST_PRIOR, cfg.prior_dof, VAR_FLOOR, min_phi=HOST_PRIOR)
        self.mss = float(fabric.spec.mtu - TCP_IP_HEADERS)
        self._held: Samples | None = None
        self._exposed = np.zeros(self.shape, bool)     # hosts exposed to a fabric loss in the last pulse
        self._owed_held = np.zeros(self.shape)         # each host's shortfall (<= 0) in the held pulse
        self._owed_before_held = np.zeros(self.shape)  # ... in the pulse before the held one
        self._per_host: deque[float] = deque(maxlen=HOST_HISTORY)   # recent pulses' mean per active host

    def set_shares(self, weights: dict[str, float], oos: Sequence[Link]) -> None:
        """Nothing of its own: it reads the peer test's shares each pulse."""

    def forget_held(self) -> None:
        self._held = None
        self._exposed = np.zeros(self.shape, bool)

    def samples(self, pc: PulseCounts) -> Samples:
        """The previous pulse's surpluses, as far as this pulse confirms them."""
        cur, owed_now = self._surplus(pc)
        cur.start_time = pc.start_time
        prev, self._held = self._held, cur
        owed = self._owed_before_held
        self._owed_before_held, self._owed_held = self._owed_held, owed_now
        if prev is not None and HOST_REPAYS:
            # a surplus first repays what the host was short in the pulse before (see _surplus)
            prev.r = np.where(prev.mask & (prev.r > 0), np.maximum(prev.r + owed, 0.0), prev.r)
        out = confirmed(prev, cur, self.shape)
        # a pulse whose successor is exposed to a fabric loss (see _surplus) cannot be confirmed: not judged
        # (a zero would read as the host loss having stopped and clear its alert)
        out.mask = out.mask & ~self._exposed
        return out

    def _surplus(self, pc: PulseCounts) -> tuple[Samples, np.ndarray]:
        """This pulse's samples, and each host's shortfall against its peers (<= 0; see below)."""
        S, H = self.S, self.H
        counts = pc.data if pc.data is not None else pc.ip
        to_host = counts[S:S + H, 1, :].astype(float)           # [host, source class]
        obs = delivered = host_delivered(pc, S, H, self.mss)   # obs: less what fabric losses explain
        ps = self.peer.last
        exposed = np.zeros(self.shape, bool)
        if ps is not None and ps.mask.any() and self.peer.per_source:
            sd = np.sqrt(self.peer.noise.variance(ps.u, ps.cls))
            w = self.peer.shares()
            lost = np.where(ps.mask, np.maximum(0.0, ps.r - 2.0 * sd) / np.maximum(1.0 - w, 1e-9), 0.0).sum(axis=1)
            src = to_host[:, 1:self.peer.L + 1]                   # [host, source leaf]
            tot = src.sum(axis=0, keepdims=True)
            frac = np.divide(src, tot, out=np.zeros_like(src), where=tot > 0)
            obs = obs - np.minimum(frac @ lost, obs)
            # Retransmissions after a fabric loss overshoot what is taken off above (spurious ones; live:
            # two 2% drops under reduce_scatter gave two healthy host links a surplus alert): a host that
            # gets traffic from a source with a deficit beyond EXPOSED_Z sd in this pulse is not judged
            # in it (healthy pulses: each of a 4x4 leaf's 12 cells passes 3 sd 0.13% of the time).
            # SwitchDetector also stops judging host ports while a peer-test alert is open.
            strong = (np.where(ps.mask, ps.r - EXPOSED_Z * sd, 0.0) > 0).any(axis=1)
            exposed = (src[:, strong] > 0).any(axis=1)
        self._exposed = exposed
        active = self.judged & busy_hosts(obs, self.cfg.min_cell_pkts)
        n = int(active.sum())
        if n < 2:
            # Nothing to judge, but a host that got nothing while a peer got packets is owed them: an
            # iteration's head that reached one host early, alone in its pulse (live, ddp: 237 packets
            # to h2 only, then h3 stood 237 above h2 in the next pulse, confirmed by the one after:
            # a false 4.3% alert). A host outside the job is owed for ever and never judged.
            z = np.zeros(self.shape)
            owed = np.zeros(self.shape)
            if int(self.judged.sum()) >= 2 and HOST_REPAYS and HOST_OWED_ALONE:
                _, owed = peer_gap(obs, self.judged)
            return Samples(z, np.ones(self.shape), z, np.zeros(self.shape, bool), z, obs), owed
        others, owed = peer_gap(obs, active)
        # An iteration cut short by a stall (its tail comes in the next pulse) makes the hosts it spares
        # look in surplus: with two hosts a leaf cannot tell "h7 got more" from "h6 got less" (live: h6
        # short by 1,094 packets, then its tail and the next iteration's head misaligned two pulses more;
        # h7 raised a false 8% alert). A lossy host link only adds packets, so hosts are not judged in a
        # pulse whose mean per active host is more than HOST_SHORT below one iteration's (HOST_REFERENCE).
        mean = float(delivered[active].mean())
        iteration = float(np.quantile(self._per_host, HOST_REFERENCE)) if self._per_host else 0.0
        short = len(self._per_host) >= HOST_SHORT_AFTER and mean < (1.0 - HOST_SHORT) * iteration
        # ... nor in one where every active host got more than one iteration, unlike the pulse before (HOST_LONG)
        long = HOST_LONG and len(self._per_host) >= HOST_SHORT_AFTER and \
            float(delivered[active].min()) > (1.0 + HOST_SHORT) * iteration and \
            abs(mean - self._per_host[-1]) > HOST_SHORT * self._per_host[-1]
        self._per_host.append(mean)
        # A host short of its peers in this pulse is owed what the next pulse brings it (a leaf-to-host
        # loss only ever adds packets at the leaf): a stall that cut the tail of an iteration off into
        # the next one's pulse (the assembler folds small pulses forward) shows as a deficit here and a
        # surplus in the next, and the surplus is judged net of the deficit. Live (ddp, a fabric loss
        # elsewhere): 359 packets to one host arrived 160 ms after its iteration, were judged with the
        # next one, and that host's link raised a false 3.6% alert when its peer's tail did the same
        # two pulses later (the forward confirmation in ``confirmed`` saw a surplus twice).
        # More than HOST_BAND apart is the job, not a silent loss: an iteration that a stall cut in two
        # pulses (live: 4 and 2,190 packets to a leaf's two hosts, then 10,212 and 8,026), a rank that
        # finished first. Such cells are not judged (a host link losing more than 10% is no silent fault).
        mask = active & ~exposed & (others >= self.cfg.min_cell_pkts) & (np.abs(obs - others) <= HOST_BAND * others) \
            & (not short) & (not long)
        u = np.where(mask, obs + others / (n - 1), 1.0)
        return Samples(np.where(mask, obs - others, 0.0), u, others, mask, others, obs), owed

    def take_findings(self) -> list[Finding]:
        return []

    def learn(self, smp: Samples) -> None:
        return None

    def suspects(self, idx: tuple) -> Suspect:
        """The host link, or the way back of the host's ACKs: lost ACKs make senders resend (live: a 2%
        loss on leaf2->spine1 gave h5 a 2% surplus under allgather). The uplinks' owners settle it."""
        (h,) = idx
        link = Link(self.switch, self.hosts[h])
        ups = tuple(Link(self.switch, p.peer) for p in self.fabric.uplinks(self.switch))
        return Suspect(self.S + h, "out", None, None, (link,) + ups)

    def state(self) -> dict:
        return {}

    def load(self, d: dict) -> None:
        return None


class CorruptionCheck:
    kind = CheckKind.CORRUPTION

    def __init__(self, fabric: Fabric, switch: str, degraded: set[str]) -> None:
        self.fabric, self.switch = fabric, switch
        ports = fabric.ports[switch]
        self.shape = (len(ports),)
        self.judged = np.array([f"{p.peer}->{switch}" not in degraded for p in ports])

    def counts(self, pc: PulseCounts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bad = pc.bad[:, 0].astype(float)
        frames = pc.ip[:, 0].sum(axis=1).astype(float) + bad
        return bad, frames, self.judged & (frames > 0)

    def suspects(self, idx: tuple) -> Suspect:
        (p,) = idx
        port = self.fabric.port(self.switch, p)
        link = Link(port.peer, self.switch)
        return Suspect(p, "in", None, link, (link,))
