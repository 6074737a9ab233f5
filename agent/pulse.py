"""Per-pulse port counts: the one input format of the detector.

The live agent makes them from its switch's eBPF counters (agent/reader.py), the
replay from recorded runs (analysis/traces.py), the scale model from simulation
(analysis/model.py). Nothing here knows where they came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PulseCounts:
    """What one switch counted during one pulse (one collective iteration).

    ``ip[port, dir, src]``: IPv4 packets (TCP data, TCP control, other IPv4) per
    port, direction (0 in, 1 out) and source class (0 other, 1..L source leaf + 1).
    ``bad[port, dir]``: IPv4 packets with a broken header (corrupted on the wire).
    ``data[port, dir, src]``: of ``ip``, the TCP packets that carry payload (None when the
    source cannot tell): the spine's balance test uses them, ACK storms do not count.
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
                **({"data": self.data.tolist()} if self.data is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "PulseCounts":
        return cls(switch=d["switch"], pulse=d["pulse"], ip=np.asarray(d["ip"], dtype=np.int64),
                   bad=np.asarray(d["bad"], dtype=np.int64), start_ns=d.get("start_ns", 0), end_ns=d.get("end_ns", 0),
                   start_time=d.get("start_time", 0.0), end_time=d.get("end_time", 0.0), merged=d.get("merged", 1),
                   meta={**d.get("meta", {}), **({"scores": d["scores"]} if "scores" in d else {})},
                   data=np.asarray(d["data"], dtype=np.int64) if d.get("data") is not None else None)
