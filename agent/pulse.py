"""Per-pulse port counts: the one input format of the detector.

The live agent makes them from its switch's eBPF counters (agent/reader.py), the
replay from recorded runs (analysis/traces.py), the scale model from simulation
(analysis/model.py). Nothing here knows where they came from.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from netns_testbed.datapath import (SPAN_BYTES, SPAN_FIELDS, SPAN_FIRST, SPAN_NEW,  # noqa: F401
                                    SPAN_RESENT)   # PulseCounts.span's last axis (bpf/switch.h)


@dataclass
class PulseCounts:
    """What one switch counted during one pulse (one collective iteration).

    ``ip[port, dir, src]``: IPv4 packets (TCP data, TCP control, other IPv4) per
    port, direction (0 in, 1 out) and source class (0 other, 1..L source leaf + 1).
    ``bad[port, dir]``: IPv4 packets with a broken header (corrupted on the wire).
    ``data[port, dir, src]``: of ``ip``, the TCP packets that carry payload (None when the
    source cannot tell): the spine's balance test uses them, ACK storms do not count.
    ``dup[port, dir, (segments, bytes)]``: TCP segments carrying a D-SACK block and the sequence
    bytes those blocks report (None when the source cannot tell): on a leaf's port from host N,
    what host N says it received twice (spurious retransmissions; the host test takes them off).
    ``span[port, remote, field]``: the owner's same-packet reference on a fabric port's ingress
    (bpf/switch.h, struct fp_span), per remote leaf class (a spine: the destination leaf; a leaf: the
    source leaf) and field (``SPAN_FIELDS``: segments with new data, resent segments, new bytes,
    sequence span); None when the source keeps none.
    """

    switch: str
    pulse: int
    ip: np.ndarray
    bad: np.ndarray
    start_ns: int = 0
    end_ns: int = 0
    start_time: float = 0.0
    end_time: float = 0.0
    merged: int = 1                      # kernel pulses folded into this one (late reader)
    meta: dict = field(default_factory=dict)
    data: np.ndarray | None = None
    dup: np.ndarray | None = None
    span: np.ndarray | None = None

    @property
    def total(self) -> int:
        return int(self.ip[:, 0].sum())

    @property
    def nports(self) -> int:
        return self.ip.shape[0]

    def to_dict(self) -> dict:
        return {"switch": self.switch, "pulse": self.pulse, "start_ns": self.start_ns, "end_ns": self.end_ns,
                "start_time": self.start_time, "end_time": self.end_time, "merged": self.merged,
                "ip": self.ip.tolist(), "bad": self.bad.tolist(), **({"meta": self.meta} if self.meta else {}),
                **({"data": self.data.tolist()} if self.data is not None else {}),
                **({"dup": self.dup.tolist()} if self.dup is not None else {}),
                **({"span": self.span.tolist()} if self.span is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "PulseCounts":
        return cls(switch=d["switch"], pulse=d["pulse"], ip=np.asarray(d["ip"], dtype=np.int64),
                   bad=np.asarray(d["bad"], dtype=np.int64), start_ns=d.get("start_ns", 0), end_ns=d.get("end_ns", 0),
                   start_time=d.get("start_time", 0.0), end_time=d.get("end_time", 0.0), merged=d.get("merged", 1),
                   meta={**d.get("meta", {}), **({"scores": d["scores"]} if "scores" in d else {})},
                   data=np.asarray(d["data"], dtype=np.int64) if d.get("data") is not None else None,
                   dup=np.asarray(d["dup"], dtype=np.int64) if d.get("dup") is not None else None,
                   span=np.asarray(d["span"], dtype=np.int64) if d.get("span") is not None else None)


def merge(parts: list[PulseCounts]) -> PulseCounts:
    """One pulse that counts what ``parts`` (consecutive pulses of one switch) counted together."""
    if len(parts) == 1:
        return parts[0]
    first, last = parts[0], parts[-1]
    data = None if any(p.data is None for p in parts) else sum(p.data for p in parts)
    dup = None if any(p.dup is None for p in parts) else sum(p.dup for p in parts)
    span = None if any(p.span is None for p in parts) else sum(p.span for p in parts)
    meta = {**first.meta, "fragments": [p.pulse for p in parts]}
    return PulseCounts(last.switch, last.pulse, sum(p.ip for p in parts), sum(p.bad for p in parts),
                       start_ns=first.start_ns, end_ns=last.end_ns, start_time=first.start_time,
                       end_time=last.end_time, merged=sum(p.merged for p in parts), meta=meta, data=data,
                       dup=dup, span=span)


class PulseAssembler:
    """Puts back together the iterations that a stall cut into several pulses.

    The kernel closes a pulse after an idle gap (the spray program's ``gap_ms``). On a busy machine a
    rank can stall longer than that in the middle of an iteration, and the iteration arrives as two or
    three pulses: live, 0.09 + 0.50 + 0.43 of the usual size. Each part is unbalanced (a leaf has
    received what it has not forwarded yet) while their sum is not, and the spine's balance test read
    the parts as a 4-5% loss on every spine at once. A pulse smaller than ``share`` of the median of the
    last ``HISTORY`` pulses is held and the pulses after it are added to it until the sum reaches that
    share (or ``MAX_PARTS`` pulses were folded). Adding the counts of consecutive pulses is always
    valid for every test: they only judge a longer stretch of time, so no budget changes; a job that
    shrinks is merged a few pulses at a time until the median has followed it (half of ``HISTORY``).
    """

    HISTORY = 15         # pulses whose median is the usual size
    MIN_HISTORY = 3      # pulses before anything is held
    MAX_PARTS = 8        # never fold more pulses than this into one

    def __init__(self, share: float, min_pkts: int) -> None:
        self.share, self.min_pkts = share, min_pkts
        self.sizes: deque[int] = deque(maxlen=self.HISTORY)
        self.held: list[PulseCounts] = []

    def push(self, pc: PulseCounts) -> PulseCounts | None:
        """The pulse to judge now (``pc`` itself, or the parts it completes), or None while holding."""
        usual = float(np.median(self.sizes)) if len(self.sizes) >= self.MIN_HISTORY else 0.0
        if pc.total >= self.min_pkts:
            self.sizes.append(pc.total)
        if self.share <= 0 or usual <= 0:
            return pc
        if not self.held and pc.total >= self.share * usual:
            return pc
        self.held.append(pc)
        if sum(p.total for p in self.held) >= self.share * usual or len(self.held) >= self.MAX_PARTS:
            parts, self.held = self.held, []
            return merge(parts)
        return None
