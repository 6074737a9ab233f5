"""Counter-level fabric model: per-switch per-port pulse counters with the right randomness.

For fabrics one box cannot hold (32 leaves x 64 spines, Llama-sized gradients)
this generates what each switch's counters would show per pulse, and feeds the
same detector the agent runs. What it models, per iteration (= pulse):

* a ring collective: rank r sends ``2(N-1)/N x S`` bytes to rank r+1 in
  ``mss``-sized packets; the receiver returns ``ack_ratio`` ACKs per packet;
* spraying at the source leaf over the spines usable for the destination
  (fabric model shares, weights, out-of-service links):
  random = multinomial; ``rrdst`` = one exact rotation per (CPU, destination),
  so per port within +-1 per CPU; ``rr`` = one rotation per CPU shared by all
  destinations, whose phase is reshuffled by other traffic about every
  ``rr_burst`` packets;
* losses: binomial drops (or corruption, counted as damaged frames) on any
  directed leaf-spine link, and drops on host links (``h3->leaf1`` before the
  leaf counts, ``leaf1->h3`` after); lost data packets are retransmitted and sprayed
  again until delivered; lost ACKs are not resent (cumulative ACKs);
* spurious retransmissions: spraying reorders packets, and TCP resends a
  fraction ``spurious`` of data packets that were not lost, in bursts of mean
  ``spurious_burst`` (sprayed like any packet). They are the main noise of a
  spine's in/out balance; 0.005 in bursts of 8 matches the recorded rrdst
  traces (tests/test_model.py).

Validated against the recorded 4x4 traces (tests/test_model.py): the healthy
per-port deviation of every spray mode and the deficit of a 1% fault.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field

import numpy as np

from agent.pulse import SPAN_BYTES, SPAN_FIELDS, SPAN_FIRST, SPAN_NEW, SPAN_RESENT, PulseCounts
from netns_testbed.topo import Fabric, FabricSpec, SprayMode, node_num


@dataclass
class ModelSpec:
    fabric: FabricSpec = field(default_factory=FabricSpec)
    size: int = 4 << 20                # bytes per allreduce
    ranks: int | None = None           # default: every host
    spray: SprayMode = SprayMode.RRDST
    mss: int = 1448
    ack_ratio: float = 0.0128          # pure ACKs per data packet (recorded runs: ~133 per 10,300)
    ncpu: int = 2
    rr_burst: int = 110                # rr: packets between phase reshuffles
    spurious: float = 0.005            # data packets resent without a loss (reordering), per packet
    spurious_burst: float = 8.0        # ... in bursts of this mean size (one reordering, several resends)
    faults: dict[str, float] = field(default_factory=dict)   # directed leaf-spine link -> drop rate
    corrupt: dict[str, float] = field(default_factory=dict)  # directed link -> corruption rate
    out_of_service: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    spans: bool = True                 # keep the same-packet reference's sums (the testbed's datapath does)

    def __post_init__(self) -> None:
        self.spray = SprayMode.parse(self.spray)      # a caller may name it by its value


class FabricModel:
    """Generates PulseCounts for every switch, pulse by pulse."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.fabric = Fabric(spec.fabric)
        self.rng = np.random.default_rng(spec.seed)
        self.phase: dict[tuple, int] = {}     # rrdst rotation phase per (flow, CPU, ports)
        f = self.fabric
        n = spec.ranks or len(f.hosts)
        # interleaved placement: rank r on leaf r % L
        order = [h for j in range(f.spec.hosts_per_leaf) for leaf in f.leaves for h in [f.leaf_hosts(leaf)[j]]]
        self.hosts = order[:n]
        self.leaf_of = [node_num(f.host_leaf(h)) for h in self.hosts]
        self.pkts = int(np.ceil(2 * (n - 1) / n * spec.size / spec.mss))
        L, S = f.spec.leaves, f.spec.spines
        self.set_out_of_service(f.parse_link_list(spec.out_of_service))
        self.up_loss = np.zeros((L, S))
        self.down_loss = np.zeros((S, L))
        self.up_bad = np.zeros((L, S))
        self.down_bad = np.zeros((S, L))
        self.host_up: dict[tuple[int, int], float] = {}     # (leaf, slot) -> drop rate on hN->leafM
        self.host_down: dict[tuple[int, int], float] = {}   # (leaf, slot) -> drop rate on leafM->hN
        self.pulse = 0
        self.set_faults(spec.faults, spec.corrupt)

    def set_out_of_service(self, oos: list, weights: dict[str, float] | None = None) -> None:
        """The leaves spray with ``oos`` out of service (and uplink ``weights``, None: as they are) from the
        next pulse on (a drain, a restore, a canary weight)."""
        f = self.fabric
        L, S = f.spec.leaves, f.spec.spines
        self.oos = list(oos)
        if weights is not None:
            self.spec = dataclasses.replace(self.spec, weights=dict(weights))
        self.shares = np.zeros((L, L, S))
        for a in range(L):
            for b in range(L):
                if a != b:
                    sh = f.spray_shares(f"leaf{a}", f"leaf{b}", self.spec.weights, self.oos)
                    for s, w in sh.items():
                        self.shares[a, b, node_num(s)] = w

    def set_faults(self, drops: dict[str, float], corrupt: dict[str, float] | None = None) -> None:
        for arr in (self.up_loss, self.down_loss, self.up_bad, self.down_bad):
            arr[:] = 0
        self.host_up, self.host_down = {}, {}
        for table, up, down in ((drops, self.up_loss, self.down_loss), (corrupt or {}, self.up_bad, self.down_bad)):
            for name, p in table.items():
                link = self.fabric.parse_link(name)
                hosts = [n for n in (link.src, link.dst) if n.startswith("h")]
                if hosts:
                    if table is not drops:
                        raise ValueError(f"the model corrupts leaf-spine links only, not {name}")
                    h = hosts[0]
                    key = (node_num(self.fabric.host_leaf(h)), self.fabric.host_slot(h))
                    (self.host_up if link.src == h else self.host_down)[key] = p
                    continue
                if link.src.startswith("leaf"):
                    up[node_num(link.src), node_num(link.dst)] = p
                else:
                    down[node_num(link.src), node_num(link.dst)] = p

    # -- spraying --------------------------------------------------------------
    def _split(self, n: int, w: np.ndarray, flow: tuple[int, int, int, int]) -> np.ndarray:
        """Packets per spine for n packets of one flow (source leaf, destination leaf, host slots), as
        the flow's spray mode splits them (SPLITS: one function per mode)."""
        if n <= 0:
            return np.zeros_like(w, dtype=np.int64)
        return SPLITS[self.spec.spray](self, n, w, flow)

    def _split_random(self, n: int, w: np.ndarray, flow: tuple) -> np.ndarray:
        """random: every packet draws its uplink, a multinomial split."""
        return self.rng.multinomial(n, w)

    def _split_rrdst(self, n: int, w: np.ndarray, flow: tuple) -> np.ndarray:
        """rrdst: one rotation per (CPU, destination leaf). The rotation carries on from pulse to pulse,
        as the kernel's counter does: a port's count over any stretch of pulses is within one per CPU of
        its share (pulses folded together are no noisier than one). Each flow keeps its own rotations
        (see bench/scale.py on ``rotations``)."""
        chunks = self.rng.multinomial(n, np.full(self.spec.ncpu, 1 / self.spec.ncpu))
        return self._rotations(chunks, w, flow, keep_phase=True)

    def _split_rr(self, n: int, w: np.ndarray, flow: tuple) -> np.ndarray:
        """rr: one rotation per CPU shared by every destination: other traffic reshuffles a flow's phase
        between bursts of ``rr_burst`` packets."""
        nb = max(1, int(round(n / self.spec.rr_burst)))
        return self._rotations(self.rng.multinomial(n, np.full(nb, 1 / nb)), w, flow, keep_phase=False)

    def _rotations(self, chunks: np.ndarray, w: np.ndarray, flow: tuple, keep_phase: bool) -> np.ndarray:
        """Round-robin over the uplinks with a weight, one rotation per chunk: each port gets its whole
        share of the chunk and the remainder goes one each to the next ports from the rotation's phase
        (weighted: an exact largest-remainder split of each chunk)."""
        idx = np.flatnonzero(w > 0)
        k = len(idx)
        out = np.zeros(len(w), dtype=np.int64)
        wk = w[idx] / w[idx].sum()
        equal = np.allclose(wk, wk[0])
        for ci, c in enumerate(chunks):
            if equal:
                base, extra = divmod(int(c), k)
                out[idx] += base
                if keep_phase:
                    key = (flow, ci, k)
                    start = self.phase[key] if key in self.phase else int(self.rng.integers(k))
                    self.phase[key] = (start + extra) % k
                else:
                    start = int(self.rng.integers(k))
                if extra:
                    out[idx[(start + np.arange(extra)) % k]] += 1
            else:
                ideal = c * wk
                fl = np.floor(ideal).astype(np.int64)
                rem = int(c - fl.sum())
                order = np.argsort(-(ideal - fl) + self.rng.random(k) * 1e-9)
                fl[order[:rem]] += 1
                out[idx] += fl
        return out

    # -- one pulse --------------------------------------------------------------
    def step(self) -> dict[str, PulseCounts]:
        """One iteration's counters at every switch."""
        f = self.fabric
        L, S, H = f.spec.leaves, f.spec.spines, f.spec.hosts_per_leaf
        nsrc = L + 2
        leaf_ip = np.zeros((L, S + H, 2, nsrc), np.int64)
        spine_ip = np.zeros((S, L, 2, nsrc), np.int64)
        leaf_bad = np.zeros((L, S + H, 2), np.int64)
        spine_bad = np.zeros((S, L, 2), np.int64)
        leaf_data = np.zeros_like(leaf_ip)
        spine_data = np.zeros_like(spine_ip)
        # the same-packet reference (bpf/switch.h struct fp_span): [switch, port, remote leaf class, field]
        leaf_span = np.zeros((L, S + H, nsrc, len(SPAN_FIELDS)), np.int64)
        spine_span = np.zeros((S, L, nsrc, len(SPAN_FIELDS)), np.int64)
        self._spans = (leaf_span, spine_span)
        n = len(self.hosts)
        for r in range(n):
            src_h, dst_h = self.hosts[r], self.hosts[(r + 1) % n]
            a, b = self.leaf_of[r], self.leaf_of[(r + 1) % n]
            ja, jb = f.host_slot(src_h), f.host_slot(dst_h)
            dup = 0
            if self.spec.spurious > 0:   # resent without a loss: more packets of the same flow (same rotation)
                bursts = self.rng.poisson(self.spec.spurious * self.pkts / self.spec.spurious_burst)
                dup = int(self.rng.geometric(1.0 / self.spec.spurious_burst, bursts).sum()) if bursts else 0
            self._flow(a, b, ja, jb, self.pkts + dup, True, leaf_ip, spine_ip, leaf_bad, spine_bad, leaf_data,
                       spine_data, resent=dup)
            acks = self.rng.binomial(self.pkts, min(1.0, self.spec.ack_ratio)) if self.spec.ack_ratio < 1 else \
                int(self.pkts * self.spec.ack_ratio)
            self._flow(b, a, jb, ja, acks, False, leaf_ip, spine_ip, leaf_bad, spine_bad)
        self.pulse += 1
        out = {}
        for li, leaf in enumerate(f.leaves):
            out[leaf] = PulseCounts(leaf, self.pulse, leaf_ip[li], leaf_bad[li], meta={"iter": self.pulse - 1},
                                    data=leaf_data[li], span=leaf_span[li] if self.spec.spans else None)
        for si, spine in enumerate(f.spines):
            out[spine] = PulseCounts(spine, self.pulse, spine_ip[si], spine_bad[si], meta={"iter": self.pulse - 1},
                                     data=spine_data[si], span=spine_span[si] if self.spec.spans else None)
        return out

    def _flow(self, a: int, b: int, ja: int, jb: int, n: int, reliable: bool,
              leaf_ip, spine_ip, leaf_bad, spine_bad, leaf_data=None, spine_data=None, resent: int = 0) -> None:
        """One flow's packets. ``reliable``: data, resent until delivered, and counted in ``*_data`` too;
        ``resent`` of its ``n`` first sends are spurious retransmissions. A data flow's segments also go
        into the same-packet reference (``_spans``): its first transmissions span the flow's sequence
        space at every port they cross, each port's new bytes are the first transmissions that reached
        it, and every retransmission (spurious, or of a loss) takes a rotation slot and counts as resent."""
        S = self.fabric.spec.spines
        src = a + 1
        hp_a, hp_b = S + ja, S + jb
        ips = [(leaf_ip, spine_ip)] + ([(leaf_data, spine_data)] if reliable and leaf_data is not None else [])
        q_up, q_dn = self.host_up.get((a, ja), 0.0), self.host_down.get((b, jb), 0.0)
        w = self.shares[a, b]
        pending = n
        for rnd in range(50):
            if pending <= 0:
                break
            lost_host = int(self.rng.binomial(pending, q_up)) if q_up else 0
            at_leaf = pending - lost_host                                                   # lost on hN->leaf
            if a == b:
                got = at_leaf
                for lc, _ in ips:
                    lc[a, hp_a, 0, src] += at_leaf
                    lc[a, hp_b, 1, src] += got
            else:
                c = self._split(at_leaf, w, (a, b, ja, jb))
                lost_up = self.rng.binomial(c, self.up_loss[a])
                bad_up = self.rng.binomial(c - lost_up, self.up_bad[a])
                at_spine = c - lost_up - bad_up
                spine_bad[np.arange(S), a, 0] += bad_up
                lost_dn = self.rng.binomial(at_spine, self.down_loss[:, b])
                bad_dn = self.rng.binomial(at_spine - lost_dn, self.down_bad[:, b])
                arrived = at_spine - lost_dn - bad_dn
                leaf_bad[b, :S, 0] += bad_dn
                got = int(arrived.sum())
                if reliable and self.spec.spans:
                    first = n - resent if rnd == 0 else 0
                    # first transmissions lost on the host's link never reach the fabric; their bytes are
                    # spanned all the same, and their retransmissions come in later as resent
                    lost_first = int(self.rng.hypergeometric(first, n - first, lost_host)) if first and lost_host else 0
                    self._span(a, b, first, first - lost_first, at_leaf, c, at_spine, arrived)
                for lc, sc in ips:
                    lc[a, hp_a, 0, src] += at_leaf            # host -> leaf (retransmissions included)
                    lc[a, :S, 1, src] += c                    # leaf a uplinks out
                    sc[np.arange(S), a, 0, src] += at_spine   # spine in from leaf a
                    sc[np.arange(S), b, 1, src] += at_spine   # spine out to leaf b
                    lc[b, :S, 0, src] += arrived              # leaf b uplinks in
                    lc[b, hp_b, 1, src] += got                # leaf b -> host
            delivered = got - (int(self.rng.binomial(got, q_dn)) if q_dn else 0)   # lost on leaf->hN
            pending = (pending - delivered) if reliable else 0


    def _span(self, a: int, b: int, first: int, first_in: int, sent: int, c: np.ndarray, at_spine: np.ndarray,
              arrived: np.ndarray) -> None:
        """One round of a data flow from leaf ``a`` to leaf ``b`` in the reference sums: the flow's
        ``first`` first transmissions span its sequence space; ``sent`` packets reached leaf a, ``first_in``
        of them first transmissions (their positions among the rotation's slots at random), ``c`` per
        spine, ``at_spine`` reached each spine, ``arrived`` each uplink of leaf b. A loss takes a packet
        of either kind alike."""
        leaf_span, spine_span = self._spans
        S = self.fabric.spec.spines
        f_c = self.rng.multivariate_hypergeometric(c, first_in) if 0 < first_in < sent else (c if first_in else 0 * c)
        f_sp = self.rng.binomial(f_c, np.divide(at_spine, c, out=np.zeros(S), where=c > 0))
        f_ar = self.rng.binomial(f_sp, np.divide(arrived, at_spine, out=np.zeros(S), where=at_spine > 0))
        mss = self.spec.mss
        for arr, cnt, tot, port, cls in ((spine_span, f_sp, at_spine, (np.arange(S), a), b + 1),
                                         (leaf_span, f_ar, arrived, (b, np.arange(S)), a + 1)):
            idx = port + (cls,)
            arr[idx + (SPAN_FIRST,)] += cnt
            arr[idx + (SPAN_RESENT,)] += tot - cnt
            arr[idx + (SPAN_NEW,)] += cnt * mss
            if first:
                arr[idx + (SPAN_BYTES,)] += np.where(cnt > 0, first * mss, 0)   # a port the flow reached


def simulate(spec: ModelSpec, pulses: int, fault_from: int = 0) -> dict[str, list[PulseCounts]]:
    """``pulses`` iterations; the spec's faults are on from pulse ``fault_from``."""
    m = FabricModel(spec)
    out: dict[str, list[PulseCounts]] = {sw: [] for sw in m.fabric.switches}
    for i in range(pulses):
        if i == fault_from:
            m.set_faults(spec.faults, spec.corrupt)
        elif i == 0:
            m.set_faults({}, {})
        for sw, pc in m.step().items():
            out[sw].append(pc)
    return out


# How the counter model splits a flow's packets, per spray mode (one function each).
SPLITS = {SprayMode.RANDOM: FabricModel._split_random, SprayMode.RR: FabricModel._split_rr,
          SprayMode.RRDST: FabricModel._split_rrdst}
