"""Live incidents: one per fault, naming the link an operator takes out of service.

What each switch decides alone, and what is fused from alerts:

* A spine names ``leafA->spineK`` alone (its balance test: the link it owns).
* Any switch names the link into a port alone when frames arrive damaged on it. Those frames are
  discarded there, so a loss that other switches see through that link joins the corruption's
  incident (one fault, one incident, one kind) instead of waiting for an owner's verdict. A tracker
  that does not see the corruption alert (one agent per switch) learns it from the receiver's verdict
  document (its ``corrupt_links``) and joins it the same way, so both agents publish the incident as a
  corruption and it pages once. Before the receiver names it, the owner's ledger settles that loss like
  any other (the receiver counts the damaged frames nowhere, so its evidence reads them as lost), and the
  incident becomes a corruption when the receiver names it (tests/test_incidents.py, on the counter model).
* A leaf names ``spineK->leafM`` alone when deficits from two or more source
  leaves share uplink K (only the common link explains them).
* A leaf sees a surplus of packets sent to host hN against its peer hosts:
  ``leafM->hN`` lost them after it counted, or ACKs from hN were lost on the
  way back (an uplink) and the sender resent. It is named ``leafM->hN`` once
  every uplink's owner judged its link since the onset, none stands out from
  the others and no other loss is open.
* A leaf's deficit on uplink K from a single source leaf A is ambiguous between
  its own ``spineK->leafM`` and spine K's ``leafA->spineK``. It is settled by
  spine K's *verdict* on the link spine K owns (an open alert there, or its
  evidence since the leaf's onset: its same-packet reference when the counts carry
  sequence spans, set beside the leaf's own on the path, else its balance test;
  see :mod:`agent.detector.verdict`). No counters are exchanged and nothing is probed.
  Until the verdict is in, the incident is ``localizing`` and names both
  candidates; a link is never named from evidence older than the onset.

The :class:`IncidentTracker` consumes the alert events of the switches it
serves and publishes incident events (JSON lines, the live view, the
``flowpulse_incident`` Prometheus series): ``open`` when a fault first shows,
``localized`` when an ambiguous one gets its link (the incident continues
under that link's id; ``previous_id`` names the one it was), ``update`` when alerts join, its rate
moves or the reason changes (e.g. from "no verdict" to "waiting for spine1's verdict"), and
``resolved`` once all its alerts have cleared. An incident's id is its link
(``leaf1->spine3``) or, while it is localizing, its candidates joined by ``|``:
two processes that see the same fault publish the same id.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from agent import verdictauth
from agent.detector import SwitchDetector
from agent.detector.alerts import Alert, AlertEvent, AlertKind, CheckKind
from agent.detector.verdict import (MODEL_ERROR, Ledger, LinkEvidence, Reference, Span, Verdict, evidence_from,
                                   judges_the_same_flows, path_evidence, settle)
from netns_testbed import untrusted
from netns_testbed.safefiles import read_bounded, write_atomic
from netns_testbed.untrusted import REFUSED, BadInput
from netns_testbed.topo import Fabric, Link, node_kind

log = logging.getLogger("flowpulse.agent.incidents")
# The verdict files' layout; an owner's file in another (an agent of another version during an upgrade)
# gives no verdict: its alerts wait, as for an owner that stopped. 2: ledger rows carry timing weights.
# 3: the ledger says what it judges by (its reference); leaves export their paths' evidence.
# 4: the links the owner's damaged-frame test names (``corrupt_links``), so that a loss another switch's
# agent reads through such a link is that corruption's incident there too (one fault, one kind, one page).
VERDICT_FORMAT = 4
# What this agent reads: its own format, and the one before it (format 3 is format 4 without corrupt_links),
# so that an agent upgraded first still has its not-yet-upgraded owners' verdicts. An agent of the previous
# release reads none of this one's (it reads only 3): logged once, its incidents wait until it is upgraded.
READ_FORMATS = (3, 4)


class EvidenceSource(Protocol):
    def evidence(self, owner: str, link: Link, since: float | Sequence[Span], loss: float,
                 toward: str | None = None) -> LinkEvidence | None: ...

    def path(self, leaf: str, name: str, since: float | Sequence[Span]) -> LinkEvidence | None: ...

    def corrupt(self, owner: str, link: str) -> bool:
        """Whether ``owner`` (the link's receiver) has an open corruption alert on ``link``: frames
        arriving damaged there. Optional: a source without it says nothing about corruption."""
        ...


class LocalEvidence:
    """Verdicts of detectors running in this process (``agent --all``, experiments, replay, model)."""

    def __init__(self, detectors: Callable[[], dict]) -> None:
        self.detectors = detectors

    def evidence(self, owner: str, link: Link, since: float | Sequence[Span], loss: float,
                 toward: str | None = None) -> LinkEvidence | None:
        det = self.detectors().get(owner)
        return det.owner.owned_evidence(link, since, loss, toward) if det is not None else None

    def path(self, leaf: str, name: str, since: float | Sequence[Span]) -> LinkEvidence | None:
        det = self.detectors().get(leaf)
        return det.owner.path_evidence(name, since) if det is not None else None

    def corrupt(self, owner: str, link: str) -> bool:
        det = self.detectors().get(owner)
        return det is not None and link in det.owner.open_links(AlertKind.CORRUPTION)


class ExportedVerdicts:
    """Verdicts of agents in other processes, as documents (:func:`verdict_document`) checked whole
    before use (:func:`check_verdict`): stale ones (older than ``max_age_s``) are ignored, an owner that
    stopped has no verdict, and so has one of another ``VERDICT_FORMAT``. Where the documents come from
    is the subclass's: :class:`VerdictFiles`, or the owners' agents (agent.verdictpeers.VerdictPeers)."""

    def __init__(self, local: EvidenceSource | None = None, max_age_s: float = 30.0, key: bytes | None = None) -> None:
        self.local, self.max_age_s, self.key = local, max_age_s, key
        self._warned: set[str] = set()
        self._checked: dict[str, tuple[str, dict]] = {}    # owner -> its last document as text, and checked

    def origin(self, owner: str) -> str:
        """Where ``owner``'s verdicts come from (for logs and the bad-input counter's one line per origin)."""
        raise NotImplementedError

    def fetch(self, owner: str) -> str:
        """``owner``'s verdict document as text; FileNotFoundError if it has none."""
        raise NotImplementedError

    def evidence(self, owner: str, link: Link, since: float | Sequence[Span], loss: float,
                 toward: str | None = None) -> LinkEvidence | None:
        if self.local is not None:
            ev = self.local.evidence(owner, link, since, loss, toward)
            if ev is not None:
                return ev
        return self._exported(owner, link.name if toward is None else f"{link.name}->{toward}", since, loss,
                              open_link=link.name)

    def path(self, leaf: str, name: str, since: float | Sequence[Span]) -> LinkEvidence | None:
        if self.local is not None:
            ev = self.local.path(leaf, name, since)
            if ev is not None:
                return ev
        return self._exported(leaf, name, since, 0.0, path=True)

    def corrupt(self, owner: str, link: str) -> bool:
        if self.local is not None and getattr(self.local, "corrupt", None) is not None \
                and self.local.corrupt(owner, link):
            return True
        d = self._document(owner)
        return d is not None and link in d.get("corrupt_links", [])

    def _document(self, owner: str) -> dict | None:
        """``owner``'s verdict document, checked whole and fresh: None if it is missing, stale, of another
        format, or bad (counted in ``flowpulse_bad_input_total{source="verdict"}``, one log line; see
        :func:`check_verdict`)."""
        f = self.origin(owner)
        try:
            text = self.fetch(owner)
            hit = self._checked.get(owner)
            if hit is not None and hit[0] == text:      # the same document as last asked: checked already
                d = hit[1]
            else:
                d = check_verdict(text, owner, self.key)
                self._checked[owner] = (text, d)
        except FileNotFoundError:
            return None
        except OtherFormat as e:
            if owner not in self._warned:
                self._warned.add(owner)
                log.warning("%s's verdict file has format %s, this agent reads %s: no verdicts from %s until its "
                            "agent runs this version", owner, e.args[0], " and ".join(map(str, READ_FORMATS)), owner)
            return None
        except (OSError, BadInput) as e:
            REFUSED.refuse("verdict", f, str(e))
            return None
        return d if time.time() - d["written"] <= self.max_age_s else None

    def _exported(self, owner: str, name: str, since: float | Sequence[Span], loss: float,
                  path: bool = False, open_link: str | None = None) -> LinkEvidence | None:
        """``owner``'s evidence on ``name`` (a link, or a leaf's path) from its document (none without one,
        see :meth:`_document`)."""
        d = self._document(owner)
        if d is None or name not in d["cells"]:
            return None
        f = self.origin(owner)
        ledger = Ledger(d["ncells"], reference=Reference(d["reference"]))
        try:
            ledger.load(d["ledger"])
        except (ValueError, OverflowError) as e:
            REFUSED.refuse("verdict", f, f"ledger: {e}")
            return None
        try:
            if path:
                ev = path_evidence(ledger, d["cells"][name], since, name, owner)
            else:
                ev = evidence_from(ledger, d["cells"][name], since, name, owner,
                                   (open_link or name) in d.get("open_links", []), loss)
        except (ArithmeticError, ValueError) as e:      # numbers that hold to the schema but no estimate can use
            REFUSED.refuse("verdict", f, f"ledger: {type(e).__name__}: {e}")
            return None
        REFUSED.accepted(f)
        return ev


class VerdictFiles(ExportedVerdicts):
    """Verdicts exported by agents in other processes: ``<dir>/<switch>.json``, replaced atomically
    after every pulse by the owner (:func:`write_verdicts`)."""

    def __init__(self, directory: Path, local: EvidenceSource | None = None, max_age_s: float = 30.0,
                 key: bytes | None = None) -> None:
        super().__init__(local, max_age_s, key)
        self.dir = directory

    def origin(self, owner: str) -> str:
        return str(self.dir / f"{owner}.json")

    def fetch(self, owner: str) -> str:
        return read_bounded(self.dir / f"{owner}.json")


class OtherFormat(Exception):
    """A verdict file of another ``VERDICT_FORMAT`` (an agent of another version): args[0] is its format."""


VERDICT_SCHEMA = Path(__file__).with_name("verdict.schema.json")
CLOCK_SKEW_S = 5.0   # how far in the future a verdict file's ``written`` may be (clocks of two processes)


def check_verdict(text: str, owner: str, key: bytes | None = None) -> dict:
    """A verdict document (a file's or a peer's answer) checked whole before any of it is used: strict
    JSON, :data:`VERDICT_SCHEMA`, signed with ``key`` if there is one (agent/verdictauth.py), written by
    ``owner`` (its ``switch``), not from the future, every cell inside the ledger and every ledger row
    ``ncells`` wide. Raises :class:`OtherFormat` or :class:`BadInput`."""
    d = untrusted.loads(text)
    fmt = d.get("format", 1 if "ledger" in d else None) if isinstance(d, dict) else None   # format 1 had none
    if type(fmt) is int and fmt not in READ_FORMATS:
        raise OtherFormat(fmt)
    untrusted.check(VERDICT_SCHEMA, d)
    if key is not None:
        verdictauth.check(key, d)
    if d["switch"] != owner:
        raise BadInput(f"switch: {d['switch']!r} in {owner}'s file")
    if d["written"] > time.time() + CLOCK_SKEW_S:
        raise BadInput(f"written: {d['written']} is in the future")
    n = d["ncells"]
    bad = next((c for c, i in d["cells"].items() if i >= n), None)
    if bad is not None:
        raise BadInput(f"cells.{bad}: cell {d['cells'][bad]} outside the ledger's {n}")
    row = next((i for i, r in enumerate(d["ledger"]) if not all(len(col) == n for col in r[1:])), None)
    if row is not None:
        raise BadInput(f"ledger[{row}]: not {n} cells wide")
    return d


def write_verdicts(directory: Path, det: SwitchDetector, key: bytes | None = None) -> str | None:
    """Export a detector's verdict evidence for agents in other processes (nothing if it gives none), signed
    with the fabric's verdict ``key`` if there is one. Returns the document (what the agent's
    ``/verdicts/<switch>`` serves), or None."""
    doc = verdict_document(det, key)
    if doc is not None:
        write_atomic(directory / f"{det.switch}.json", doc)
    return doc


def verdict_document(det: SwitchDetector, key: bytes | None = None) -> str | None:
    """A detector's verdict evidence as the JSON text of its verdict file (None if it gives none)."""
    ledger = det.owner.ledger
    if ledger is None:
        return None
    # Every link's cell, and of the others (a spine's per destination leaf, a leaf's paths) those judged in
    # a kept pulse: the rest give no evidence, and a spine of a 32-leaf fabric keeps 1,056 cells, most of
    # them never judged (a ring sends each leaf's data to one or two others).
    cells = det.owner.owned_cells()
    judged = ledger.judged_cells()
    keep = sorted({c for name, c in cells.items() if name.count("->") == 1 or c in judged}) or list(range(ledger.ncells))
    index = {c: i for i, c in enumerate(keep)}
    d = {"format": VERDICT_FORMAT, "written": time.time(), "switch": det.switch, "ncells": len(keep),
         "reference": str(ledger.reference), "cells": {n: index[c] for n, c in cells.items() if c in index},
         "ledger": ledger.state(keep), "open_links": sorted(det.owner.open_loss_links()),
         "corrupt_links": sorted(det.owner.open_links(AlertKind.CORRUPTION))}
    return json.dumps(verdictauth.sign(key, d) if key is not None else d)


@dataclass
class Attribution:
    """What one open alert says about the link."""

    link: str | None
    candidates: list[str]
    how: str
    evidence: dict = field(default_factory=dict)
    kind: AlertKind | None = None     # what the fault is, where it is not the alert's own kind (a loss a corruption explains)


@dataclass
class Incident:
    incident_id: str
    link: str | None
    candidates: list[str]
    kind: AlertKind
    alerts: dict[str, Alert]          # alert id -> its latest event
    first_time: float
    how: str
    evidence: dict = field(default_factory=dict)
    rate: float = 0.0

    @property
    def state(self) -> str:
        return "localized" if self.link else "localizing"

    @property
    def domain(self) -> str:
        """The node every link the incident blames goes through (a spine before a leaf before a host): the same for a
        fault's localizing incidents (each leaf that saw it has its own candidate pair, all through spine
        K) and its localized one. The alerting rules join a domain's localizing incidents into one alert, and
        a localized incident inhibits it, so that one fault pages once."""
        links = [n.split("->") for n in ([self.link] if self.link else self.candidates)]
        common = set(links[0]).intersection(*links[1:]) if links else set()
        rank = {"spine": 0, "leaf": 1}
        return sorted(common, key=lambda n: (rank.get(node_kind(n), 2), n))[0] if common else self.incident_id

    def event(self, event: str, now: float, reporter: str | None) -> dict:
        als = list(self.alerts.values())
        return {"event": event, "incident_id": self.incident_id, "time": now, "state": self.state if event != "resolved"
                else "resolved", "link": self.link, "candidates": list(self.candidates), "domain": self.domain,
                "kind": self.kind,
                "estimated_rate": round(max((a.estimated_rate for a in als), default=self.rate), 6),
                "onset_time": min((a.onset_time or a.time for a in als), default=self.first_time),
                "first_time": self.first_time, "alerts": sorted(self.alerts),
                "switches": sorted({a.switch for a in als}), "how": self.how, "evidence": self.evidence,
                **({"reporter": reporter} if reporter else {})}


class IncidentTracker:
    """Alert events in, incident events out (see the module docstring)."""

    def __init__(self, fabric: Fabric, evidence: EvidenceSource | None, reporter: str | None = None) -> None:
        self.fabric = fabric
        self.source = evidence
        self.reporter = reporter
        self.alerts: dict[str, Alert] = {}                # open alert id -> latest event
        self.decided: dict[str, Attribution] = {}         # alert id -> a settled ambiguity (sticky)
        self.incidents: dict[str, Incident] = {}
        # an ambiguous alert that resolved before its owner's verdict came in -> the spans it was open
        # over (see verdict.Span): when it fires again (a flapping link), the owner's evidence is read over
        # every burst, never over the healthy pulses between them
        self.bursts: dict[tuple[str, str], list[Span]] = {}
        self.history: list[dict] = []                     # every incident event published
        self.lock = threading.RLock()                     # the poll loop feeds, metrics scrapes read

    # -- input ---------------------------------------------------------------------------
    def feed(self, event: Alert | dict, now: float | None = None) -> list[dict]:
        """One alert event (a dict: one read back from a file, typed here)."""
        if not isinstance(event, Alert):
            event = Alert.from_dict(event)
        aid = event.alert_id
        if event.event is AlertEvent.RESOLVED:
            was = self.alerts.pop(aid, None)
            if was is not None and aid not in self.decided and not was.link:
                key = _burst_key(was)
                end = float(event.pulse_start or event.time)
                self.bursts[key] = [s for s in self.bursts.get(key, []) if s[1] > end - BURST_MEMORY_S] + \
                    [(_onset(was), end)]
            self.decided.pop(aid, None)
        else:
            self.alerts[aid] = event
        return self.tick(event.time if now is None else now)

    # -- attribution of one alert -----------------------------------------------------------
    def attribute(self, a: Alert) -> Attribution:
        if a.link:
            return Attribution(a.link, [a.link], f"named by {a.switch}")
        cands = list(a.candidates or [])
        if a.alert_id in self.decided:
            return self.decided[a.alert_id]
        if a.test is CheckKind.HOST:
            return self._host(a, cands)
        damaged = self._corrupt(cands) if a.kind is AlertKind.LOSS else None
        if damaged is not None:
            # A frame damaged on a link is discarded where it arrives (the receiver checks its header or
            # checksum): downstream it is missing, a loss through that link. A loss whose candidates include
            # a link its receiver names corrupt is that corruption's, not a second fault, and stays with it
            # (sticky) until it clears. Left to the owner's verdict, that verdict waited while the named
            # link was drained, came after the operator had repaired and restored it, and the loss became a
            # second incident that drained the repaired link again (bench/paging.py, live). With one agent
            # per switch the receiver's verdict document says it: settled by the owner's ledger instead
            # (which reads the discarded frames as lost), the loss was a loss beside the owner's own
            # corruption, two pages for one fault.
            switch, link, via = damaged
            att = Attribution(link, [link], f"explained by the corruption {switch} names on {link}{via}",
                              kind=AlertKind.CORRUPTION)
            self.decided[a.alert_id] = att
            return att
        ups = [self.fabric.parse_link(c) for c in cands if node_kind(self.fabric.parse_link(c).dst) == "spine"]
        downs = [c for c in cands if node_kind(self.fabric.parse_link(c).dst) != "spine"]
        if len(ups) != 1 or len(downs) != 1:
            return Attribution(None, cands, "ambiguous: " + " or ".join(cands))
        up, down = ups[0], downs[0]
        rate = float(a.estimated_rate)
        window = self.bursts.get(_burst_key(a), []) + [(_onset(a), math.inf)]
        path = self._path(up, a.switch, window)
        if path is not None and path.start is not None:
            window = window[:-1] + [(path.start, math.inf)]     # where the leaf's own evidence says it began
        # Spine K's evidence on the flows this leaf misses: its cell of leaf A's flows towards this leaf
        # (the same packets as the path's), or where it judged none there (too few segments: a path that
        # carries only ACKs), on everything that came in from leaf A.
        ev = self._evidence(up, window, rate, toward=a.switch)
        same_flows = judges_the_same_flows(ev)
        if not same_flows:
            ev = self._evidence(up, window, rate)
        sd = float((a.evidence or {}).get("rate_sd") or max(rate / 4, 1e-4))
        agrees = path is not None and _path_agrees(path, rate, sd)
        if ev is not None and ev.reference is Reference.SPAN and agrees:
            # Both ends judge the same packets: spine K the link from leaf A, this leaf the path through
            # spine K. Upstream, both read the loss; downstream, spine K reads none. The leaf's rate is its
            # own path's (no model between two tests), its sd the path evidence's.
            verdict, llr = settle(ev, path.rate, path.sd, model_error=0.0)
        else:
            verdict, llr = settle(ev, rate, sd)
        blind = verdict is Verdict.DOWNSTREAM and ev is not None and ev.reference is Reference.SPAN \
            and not same_flows and not agrees
        if blind:
            # Spine K judged none of the flows this leaf misses (a path that carries only ACKs, or too few
            # segments), and nothing says the loss takes every flow alike: its whole port reading intact
            # clears leaf A's other flows, not these (live: a quarter of leaf2->spine1's flows blackholed,
            # pure ACKs towards leaf3: leaf3 missed 57% of them, spine1's port read -0.09% +- 0.17%, and
            # the verdict named the healthy spine1->leaf3). It stays localizing.
            verdict = Verdict.UNDECIDED
        detail = {"owner": up.dst, "verdict": str(verdict),
                  "llr_upstream": None if math.isinf(llr) else round(llr, 2),
                  **({"owner_evidence": ev.to_dict()} if ev else {}),
                  **({"path_evidence": path.to_dict()} if path else {})}
        if verdict is Verdict.UPSTREAM:
            att = Attribution(up.name, [up.name], f"{up.dst}'s verdict: its link from {up.src} is lossy", detail)
        elif verdict is Verdict.DOWNSTREAM:
            att = Attribution(down, [down], f"{up.dst}'s verdict: its link from {up.src} is intact", detail)
        else:
            why = "no verdict from " + up.dst if verdict is Verdict.UNJUDGED else "waiting for " + up.dst + "'s verdict"
            if blind:
                why = f"{up.dst} judges none of {up.src}'s flows towards {a.switch}"
            return Attribution(None, cands, f"localizing: {why}", detail)
        self.decided[a.alert_id] = att
        return att

    def _corrupt(self, cands: list[str]) -> tuple[str, str, str] | None:
        """(receiver, link, how it is known): the first of ``cands`` its receiver's damaged-frame test names
        corrupt, from an open corruption alert this tracker sees (how: "") or else the receiver's evidence
        source (:meth:`EvidenceSource.corrupt`, a verdict document: " (its verdict)"); None if none is."""
        seen = next((x for x in self.alerts.values() if x.kind is AlertKind.CORRUPTION and x.link in cands), None)
        if seen is not None:
            return seen.switch, seen.link, ""
        ask = getattr(self.source, "corrupt", None)
        if ask is None:
            return None
        for c in cands:
            owner = self.fabric.parse_link(c).dst
            if node_kind(owner) in ("leaf", "spine") and ask(owner, c):
                return owner, c, " (its verdict)"
        return None

    def _evidence(self, link: Link, since: float | Sequence[Span], loss: float,
                  toward: str | None = None) -> LinkEvidence | None:
        """The verdict evidence of ``link``'s owner (its downstream switch) since ``since``, for an alert of
        rate ``loss``; with ``toward``, on the link's flows towards that leaf alone (None if the owner
        keeps no such cell)."""
        return self.source.evidence(link.dst, link, since, loss, toward) if self.source is not None else None

    def _path(self, up: Link, leaf: str, since: float | Sequence[Span]) -> LinkEvidence | None:
        """The alerting leaf's own same-packet evidence on the path ``up`` then ``spineK->leaf``, if it
        keeps one and judged it since ``since``."""
        if self.source is None or not hasattr(self.source, "path"):
            return None
        ev = self.source.path(leaf, f"{up.name}->{leaf}", since)
        return ev if ev is not None and not math.isinf(ev.sd) and ev.pulses >= 1 else None

    def _host(self, a: Alert, cands: list[str]) -> Attribution:
        """A host port's surplus: ``leafM->hN``, unless the way back of hN's ACKs lost them. Named only when
        no other loss is open here and every uplink's owner has judged its link since the onset and
        none stands out (see :func:`_standing_out`)."""
        host, ups = cands[0], [self.fabric.parse_link(c) for c in cands[1:]]
        others = [x for x in self.alerts.values() if x.alert_id != a.alert_id and x.kind is AlertKind.LOSS
                  and x.test is not CheckKind.HOST]
        since = _onset(a)
        evs = [self._evidence(u, since, float(a.estimated_rate)) for u in ups]
        detail = {"uplinks": [e.to_dict() if e else {"link": u.name, "verdict": "unjudged"} for u, e in zip(ups, evs)]}
        lossy = [e.link for e in _standing_out(evs)]
        if others or lossy:
            why = f"a loss on {', '.join(lossy)}" if lossy else "another open loss"
            return Attribution(None, cands, f"localizing: {why} may be resending to {host.split('->')[1]}", detail)
        if any(e is None or math.isinf(e.sd) or e.pulses < 2 for e in evs):
            return Attribution(None, cands, "localizing: waiting for the uplinks' owners", detail)
        att = Attribution(host, [host], f"named by {a.switch}; its uplinks' owners see them intact", detail)
        self.decided[a.alert_id] = att
        return att

    # -- incidents ----------------------------------------------------------------------------
    def tick(self, now: float) -> list[dict]:
        """Re-attribute the open alerts; publish what changed."""
        want: dict[str, tuple[Attribution, list[Alert]]] = {}
        fault_kinds: dict[str, set[AlertKind]] = {}      # per incident: its alerts' kinds and what explains them
        for a in self.alerts.values():
            att = self.attribute(a)
            key = att.link or "|".join(sorted(att.candidates))
            if key in want:
                want[key][1].append(a)
            else:
                want[key] = (att, [a])
            fault_kinds.setdefault(key, set()).add(att.kind or a.kind)
        events: list[dict] = []
        renamed: dict[str, list[Incident]] = {}
        for iid, inc in list(self.incidents.items()):
            if iid in want:
                continue
            del self.incidents[iid]
            moved = [k for k, (att, als) in want.items() if att.link and any(x.alert_id in inc.alerts for x in als)]
            if moved:
                renamed.setdefault(moved[0], []).append(inc)   # it got its link: it continues under it
            else:
                events.append(inc.event("resolved", now, self.reporter))
        for key, (att, als) in want.items():
            kinds = fault_kinds[key]
            if att.link and AlertKind.LOSS in kinds and AlertKind.CORRUPTION not in kinds \
                    and self._corrupt([att.link]) is not None:
                # a loss settled before its link's receiver named the link corrupt: that corruption's
                kinds.add(AlertKind.CORRUPTION)
            kind = next((k for k in (AlertKind.CORRUPTION, AlertKind.LOSS) if k in kinds), als[0].kind)
            inc = self.incidents.get(key)
            alerts = {a.alert_id: a for a in als}
            rate = max(a.estimated_rate for a in als)
            # Every incident that got this link ends in a "localized" event naming it (previous_id), also
            # when two got it in one tick or the link already had an incident of its own.
            prevs = sorted(renamed.get(key, []), key=lambda i: i.first_time)
            if inc is None:
                first = prevs.pop(0) if prevs else None
                inc = Incident(key, att.link, sorted(att.candidates), kind, alerts,
                               min([p.first_time for p in prevs] + [first.first_time if first else now]),
                               att.how, att.evidence, rate)
                self.incidents[key] = inc
                ev = inc.event("localized" if first else "open", now, self.reporter)
                if first:
                    ev["previous_id"] = first.incident_id
                events.append(ev)
                changed = False
            else:
                changed = set(alerts) != set(inc.alerts) or kind != inc.kind or att.how != inc.how or \
                    abs(rate - inc.rate) > max(0.2 * inc.rate, 0.001)
                inc.alerts, inc.kind, inc.how, inc.evidence = alerts, kind, att.how, att.evidence or inc.evidence
                inc.first_time = min([inc.first_time] + [p.first_time for p in prevs])
                if changed:
                    inc.rate = rate
            for p in prevs:
                events.append({**inc.event("localized", now, self.reporter), "previous_id": p.incident_id})
            if changed and not prevs:
                events.append(inc.event("update", now, self.reporter))
        self.history.extend(events)
        trim_history(self.history)
        return events

    def open(self) -> list[Incident]:
        return sorted(self.incidents.values(), key=lambda i: i.first_time)


# Events kept in a tracker's (and a mitigator's) history: a daemon runs for months. The oldest tenth
# goes when it is full (the live cost of an incident older than that many events no longer finds its
# name's time).
HISTORY_EVENTS = 10_000


def trim_history(history: list[dict], limit: int | None = None) -> None:
    limit = HISTORY_EVENTS if limit is None else limit
    if len(history) > limit:
        del history[:len(history) - limit + limit // 10]


# How long an undecided burst's span is kept for the next burst of the same alert (the owner's ledger
# keeps LEDGER_PULSES pulses: older spans find no pulses there anyway).
BURST_MEMORY_S = 300.0


def _burst_key(a: Alert) -> tuple[str, str]:
    """The same alert with the same candidates: a fault that comes back where it was."""
    return a.alert_id, "|".join(sorted(a.candidates or []))


def _onset(a: Alert) -> float:
    """An alert's estimated onset (older events: its pulse start or time)."""
    return float(a.onset_time or a.pulse_start or a.time)


# How far (sd) a leaf's path evidence may read below its alert's rate and still stand in for it.
PATH_AGREES_Z = 3.0


def _path_agrees(path: LinkEvidence, rate: float, rate_sd: float) -> bool:
    """Whether a leaf's same-packet evidence on a path reads the loss its alert (a count of packets per
    source and uplink) does. A leaf's reference follows each flow on the port its segments come in on:
    a fault that takes whole flows on ``leafA->spineK`` (a flow-selective blackhole) leaves them no
    segment there to follow, and the path reads none of the loss its alert counts (live, ``partial=0.5``
    on leaf1->spine0: the alert 60%, the path -0.04% +- 0.7%). Then the alert's own rate is the one spine
    K's evidence is held against. One-sided: an alert's rate at detection reads high (it is the window
    that crossed the threshold), never low. The alert's sd, the path's and the model error between the
    two tests (:data:`MODEL_ERROR`) make the scale."""
    scale = math.sqrt(path.sd ** 2 + rate_sd ** 2 + (MODEL_ERROR * max(rate, 0.0)) ** 2)
    return path.rate >= rate - PATH_AGREES_Z * scale


def _standing_out(evs: list[LinkEvidence | None]) -> list[LinkEvidence]:
    """Uplinks whose owners see them lossy: an alert open, or a rate more than two standard deviations
    above the mean of the leaf's other uplinks. Not above zero: the retransmissions a lossy host link
    brings in raise the leaf's inflow through every spine alike, and each spine's balance then reads
    the leaf as sending less than it receives (live: leaf1->h3 at 2% made all four uplinks look lossy
    against zero). A loss on one uplink stands out from the others."""
    judged = [e for e in evs if e is not None and not math.isinf(e.sd) and e.pulses >= 2]
    out = [e for e in evs if e is not None and e.alert_open]
    if len(judged) < 2:
        return out + [e for e in judged if e.rate > 2 * e.sd and e not in out]
    for e in judged:
        others = [o for o in judged if o is not e]
        mean = sum(o.rate for o in others) / len(others)
        sd = math.sqrt(e.sd ** 2 + sum(o.sd ** 2 for o in others) / len(others) ** 2)
        if e.rate - mean > 2 * sd and e not in out:
            out.append(e)
    return out


def summarize(history: list[dict]) -> list[dict]:
    """One row per incident from its events (an ambiguous incident that got its link is one incident):
    the link it ended with, when it opened, was localized and resolved, and how it was decided."""
    rows: dict[str, dict] = {}
    for ev in history:
        iid = ev["incident_id"]
        if ev["event"] == "localized" and ev.get("previous_id") in rows:
            row = rows.pop(ev["previous_id"])
            if iid in rows:                        # two incidents got the same link: one row
                rows[iid]["first_time"] = min(rows[iid]["first_time"], row["first_time"])
                for k in ("alerts", "candidates"):
                    rows[iid][k] = sorted(set(rows[iid][k]) | set(row[k]))
            else:
                rows[iid] = row
        row = rows.setdefault(iid, {"incident_id": iid, "first_time": ev["time"], "localized_time": None,
                                    "resolved_time": None, "alerts": [], "candidates": []})
        row.update({"incident_id": iid, "link": ev["link"], "kind": ev["kind"], "how": ev["how"],
                    "state": ev["state"], "estimated_rate": ev["estimated_rate"], "onset_time": ev["onset_time"],
                    "switches": ev["switches"], "evidence": ev["evidence"]})
        row["candidates"] = sorted(set(row["candidates"]) | set(ev["candidates"]))
        row["alerts"] = sorted(set(row["alerts"]) | set(ev["alerts"]))
        if ev["link"] and row["localized_time"] is None:
            row["localized_time"] = ev["time"]
        if ev["event"] == "resolved":
            row["resolved_time"] = ev["time"]
    return sorted(rows.values(), key=lambda r: r["first_time"])
