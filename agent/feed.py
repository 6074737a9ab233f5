"""Per-pulse port counts from anywhere, as JSON lines: the counter source for counters this project does
not read itself (a switch ASIC's, exported through SONiC's counter database or gNMI streaming telemetry
and converted), and the common path of the replay.

The feed is UTF-8 JSON, one object per line. The first line describes the fabric::

    {"flowpulse_feed": 1, "fabric": {"leaves": 4, "spines": 4, "hosts_per_leaf": 2, "mtu": 1500},
     "spray": "rrdst", "out_of_service": [], "spray_changes": []}

``spray_changes`` (optional): the drains, restores and uplink weights the pulses were sprayed under,
oldest first, each with the monotonic window its tables switched in, as a testbed's state and a run's
report keep them (``{"epoch", "action", "links", "out_of_service", "t0_ns", "t1_ns", "weights"}``): a
pulse is judged by the shares of its time, one a change crosses is not judged.

Every further line is one switch's pulse (a pulse = one collective iteration, closed at an idle gap),
in the order the pulses ended, across switches::

    {"switch": "leaf2", "pulse": 17, "start_time": 1796060749.58, "end_time": 1796060749.90,
     "start_ns": 9207164059978, "end_ns": 9207245963264,
     "ip": [[[other, from leaf0, ..., from leaf L-1, non-IP] x (in, out)] x ports],
     "bad": [[in, out] x ports], "data": (optional, like ip: TCP segments with payload),
     "dup": (optional, [[[segments, bytes] x (in, out)] x ports]: TCP segments carrying a D-SACK),
     "span": (optional, [[[first, resent, new bytes, sequence span] x remote leaf class] x ports])}

``start_ns``, ``end_ns`` (optional): the pulse's kernel monotonic times, on the clock of the header's
spray changes (a pulse without them is judged by the shares after every change). ``span``: the
owner's same-packet reference (agent.pulse.PulseCounts.span; without it the owners judge by the
balance of counts).

``ip[port][dir][src]``: IPv4 packets with a good header on the port (ports in the fabric model's order:
a leaf's uplinks spine0..S-1 then its hosts; a spine's leaves), ``dir`` 0 in, 1 out, ``src`` 0 for
other sources, ``1 + a`` for packets from leaf ``a``'s subnet and ``L + 1`` for non-IP.
``bad[port][dir]``: IPv4 packets with a broken header. ``dup[port][dir]``: TCP segments that carry a
D-SACK block and the sequence bytes those blocks report (on a leaf's port from a host: what the host
received twice; the host test takes them off). This is exactly what ``--record`` writes per
switch (``pulses-<switch>.jsonl``), so ``flowpulse replay RUN --as-feed`` turns a recorded run into a
feed. Blank lines are skipped; anything else that does not parse stops the feed with its line number.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from agent.detector import DetectorConfig, SwitchDetector
from agent.incidents import IncidentTracker, LocalEvidence
from agent.pulse import SPAN_FIELDS, PulseCounts
from netns_testbed import untrusted
from netns_testbed.errors import SpecError
from netns_testbed.state import change_from_untrusted, change_to_dict
from netns_testbed.topo import Fabric, FabricSpec, Link, SprayChange, SprayMode
from netns_testbed.untrusted import BadInput

FEED_VERSION = 1


@dataclass(frozen=True)
class FeedHeader:
    fabric: Fabric
    spray: SprayMode
    out_of_service: tuple[Link, ...] = ()
    changes: tuple[SprayChange, ...] = ()

    def to_dict(self) -> dict:
        d = {"flowpulse_feed": FEED_VERSION, "fabric": self.fabric.spec.to_dict(), "spray": str(self.spray),
             "out_of_service": [l.name for l in self.out_of_service]}
        if self.changes:
            d["spray_changes"] = [change_to_dict(c) for c in self.changes]
        return d


def parse_header(text: str) -> FeedHeader:
    try:
        d = untrusted.loads(text)
    except BadInput as e:
        raise SpecError(f"feed line 1: {e}: the first line describes the fabric "
                        '({"flowpulse_feed": 1, "fabric": {...}, "spray": "rrdst"})') from None
    if not isinstance(d, dict) or d.get("flowpulse_feed") != FEED_VERSION:
        raise SpecError(f'feed line 1: not a feed header: it needs "flowpulse_feed": {FEED_VERSION}, "fabric" '
                        'and "spray"')
    unknown = set(d) - {"flowpulse_feed", "fabric", "spray", "out_of_service", "spray_changes"}
    if unknown:
        raise SpecError(f"feed line 1: unknown field(s) {sorted(unknown)}")
    fabric = Fabric(FabricSpec.from_dict(d.get("fabric")))
    oos = d.get("out_of_service", [])
    if not isinstance(oos, list):
        raise SpecError("feed line 1: out_of_service must be a list of links")
    changes = d.get("spray_changes", [])
    if not isinstance(changes, list) or len(changes) > 1000:
        raise SpecError("feed line 1: spray_changes must be a list of at most 1000 spray changes")
    parsed = tuple(change_from_untrusted(fabric, c, f"feed line 1: spray change {i + 1}") for i, c in enumerate(changes))
    if any(b.epoch <= a.epoch for a, b in zip(parsed, parsed[1:])):
        raise SpecError("feed line 1: spray_changes must be in the order they were made (epochs rising)")
    return FeedHeader(fabric, SprayMode.parse(d.get("spray", "")), tuple(fabric.parse_link_list(oos)), parsed)


def _counts(d: dict, key: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    try:
        a = np.asarray(d[key], dtype=float)
    except (KeyError, ValueError, TypeError):
        raise SpecError(f"{where}: {key!r} missing or not a nested list of numbers") from None
    except OverflowError:       # a JSON integer beyond a float's range (10**400 parses)
        raise SpecError(f"{where}: {key!r} holds a count that is not a whole number >= 0") from None
    if a.shape != shape:
        raise SpecError(f"{where}: {key!r} has shape {list(a.shape)}, this switch needs {list(shape)}")
    if not np.isfinite(a).all() or (a < 0).any() or (a > 2**62).any() or (a != np.round(a)).any():
        raise SpecError(f"{where}: {key!r} holds a count that is not a whole number >= 0")
    return a.astype(np.int64)


def parse_pulse(text: str, lineno: int, fabric: Fabric) -> PulseCounts:
    where = f"feed line {lineno}"
    try:
        d = untrusted.loads(text)
    except BadInput as e:
        raise SpecError(f"{where}: {e}") from None
    if not isinstance(d, dict):
        raise SpecError(f"{where}: a pulse is a JSON object")
    sw = d.get("switch")
    if sw not in fabric.switches:
        raise SpecError(f"{where}: unknown switch {sw!r}: this fabric has {', '.join(fabric.switches)}")
    nports, nsrc = len(fabric.ports[sw]), fabric.spec.leaves + 2
    pulse = d.get("pulse")
    if not isinstance(pulse, int) or isinstance(pulse, bool) or pulse < 0:
        raise SpecError(f"{where}: 'pulse' must be a whole number >= 0")
    times = [d.get(k, 0.0) for k in ("start_time", "end_time")]
    if any(not isinstance(t, (int, float)) or isinstance(t, bool) or not untrusted.finite(t) for t in times):
        raise SpecError(f"{where}: start_time and end_time are seconds (numbers)")
    kt = [d.get(k, 0) for k in ("start_ns", "end_ns")]
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < 2**63 for t in kt):
        raise SpecError(f"{where}: start_ns and end_ns are the kernel's monotonic ns (whole numbers >= 0; 0 or "
                        "absent: unknown)")
    ip = _counts(d, "ip", (nports, 2, nsrc), where)
    bad = _counts(d, "bad", (nports, 2), where)
    data = _counts(d, "data", (nports, 2, nsrc), where) if d.get("data") is not None else None
    dup = _counts(d, "dup", (nports, 2, 2), where) if d.get("dup") is not None else None
    span = _counts(d, "span", (nports, nsrc, len(SPAN_FIELDS)), where) if d.get("span") is not None else None
    return PulseCounts(sw, pulse, ip, bad, start_ns=kt[0], end_ns=kt[1], start_time=float(times[0]),
                       end_time=float(times[1]), data=data, dup=dup, span=span,
                       merged=int(d.get("merged", 1)) if isinstance(d.get("merged", 1), int) else 1)


def read_feed(lines: Iterable[str]) -> tuple[FeedHeader, Iterator[PulseCounts]]:
    """The header, and the pulses as they come (validated one line at a time)."""
    it = iter(enumerate(lines, start=1))
    for _, first in it:
        if first.strip():
            header = parse_header(first)
            break
    else:
        raise SpecError("feed is empty: the first line describes the fabric")

    def pulses() -> Iterator[PulseCounts]:
        for n, line in it:
            if line.strip():
                yield parse_pulse(line, n, header.fabric)

    return header, pulses()


def feed_lines(header: FeedHeader, pulses: Iterable[PulseCounts]) -> Iterator[str]:
    yield json.dumps(header.to_dict())
    for pc in pulses:
        d = pc.to_dict()
        d.pop("meta", None)
        yield json.dumps(d)


@dataclass
class Judge:
    """Every switch's detector and one incident tracker over pulses in the order they ended: what an
    agent process running all switches does, without the kernel."""

    fabric: Fabric
    cfg: DetectorConfig
    spray: SprayMode
    out_of_service: list[Link] = field(default_factory=list)
    degraded: list[Link] = field(default_factory=list)
    weights: dict | None = None
    # spray changes (drains, weights) the pulses were sprayed under, oldest first: each pulse is judged by
    # the shares of its time and one a change crosses is not judged (SwitchDetector.reshare), as live
    changes: list[SprayChange] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.detectors = {sw: SwitchDetector(self.fabric, sw, self.cfg, self.spray, self.weights,
                                             self.out_of_service, self.degraded) for sw in self.fabric.switches}
        for chg in self.changes:
            for det in self.detectors.values():
                det.take(chg)
        self.tracker = IncidentTracker(self.fabric, LocalEvidence(lambda: self.detectors))
        self.pulses = 0

    def observe(self, pc: PulseCounts) -> tuple[list[dict], list[dict]]:
        """One pulse: (its switch's alert events, the incident events they and the time caused)."""
        self.pulses += 1
        alerts, incidents = [], []
        for a in self.detectors[pc.switch].observe(pc):
            d = a.to_dict()
            if "iter" in pc.meta:
                d["iteration"] = pc.meta["iter"]
            alerts.append(d)
            incidents += self.tracker.feed(a, now=pc.end_time)
        if self.tracker.alerts:
            incidents += self.tracker.tick(pc.end_time)
        return alerts, incidents
