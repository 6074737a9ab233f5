"""Mitigation: take the link an incident blames out of the job's way at once, give back what it did not need.

The policy, per incident event (agent.incidents):

* A ``localized`` incident (``open``, ``update`` or ``localized``) of a loss or corruption: its link is
  drained now (netns_testbed.drain: no leaf sprays over it).
* A ``localizing`` incident (a leaf's deficit on uplink K from source leaf A: ``leafA->spineK`` or
  ``spineK->leafM``): the suspect uplink ``leafA->spineK`` keeps only a canary share (its weight cut to
  the policy's ``canary_weight``, :data:`CANARY_WEIGHT` unless told: leaf A sends about a twelfth of its
  usual share that way instead of a quarter; 1 keeps the full share, no canary). Draining both
  candidates would stop the loss and the evidence with it: in a ring
  collective only leaf A's flows to leaf M cross both links, and the owners' verdicts need two pulses of
  them (agent.detector.verdict.settle), so a drained pair stays undecided for good (live: a 2% drop
  on ``leaf2->spine1``, both candidates drained at the incident's open, "waiting for spine1's verdict"
  to the end of the run with one pulse of evidence). With the canary, the same detectors judge the
  suspect path at the reduced share and the verdict comes, a few pulses later at low rates: the owner
  judges fewer of the suspect's packets, so when the suspect is the lossy link its verdict needs about
  1/share as many pulses (docs/concepts/closed-loop.md has the figures). A larger weight names sooner
  and shields the job less.
* ``localized`` with a ``previous_id``: the named link is drained, and the canary of the localizing
  incident goes back to its full weight if the named link is the other candidate (it was innocent).
* ``resolved`` while still ``localizing``: the evidence went away before a link was named (a
  transient): the canary goes back to full weight. A named link is never restored by the policy: it
  carries no traffic once drained, so nothing could show that it was repaired. It comes back by an
  operator's ``flowpulse fabric restore LINK`` (no probes).
* Never more than ``max_per_switch`` links drained by the policy touch one switch, and never below the
  operator's spine floor (``min_spines``, Fabric.check_drain): a drain over either limit is refused and
  reported, and the incident stays as it is.

Every action (drain, canary, canary_lifted, refused) is an event in the incidents stream (``"event":
"mitigation"``), a Prometheus series (agent.metrics) and a line in the agent's log. Where the agent does
not own routing (a real fabric), the :class:`Actuator` is the part that changes: the testbed's spray
tables here; elsewhere Alertmanager's routing receiver, such as ``flowpulse nexthop-hook``
(agent.nexthops).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from agent.detector.alerts import AlertKind
from agent.incidents import trim_history
from netns_testbed.errors import UserError
from netns_testbed.topo import Fabric, Link, node_kind
from netns_testbed.untrusted import finite

log = logging.getLogger("flowpulse.agent.mitigation")


# A suspect uplink's weight while its incident is localizing (1: its full share). 0.5 names a lossy
# suspect a little sooner, but a blackholed quarter of the flows then cost the job 2.6x healthy
# iterations until the drain, against 1.05x at 0.25 (bench/mitigation.py --canary-weight 0.25 0.5;
# docs/concepts/closed-loop.md).
CANARY_WEIGHT = 0.25


@dataclass(frozen=True)
class MitigationPolicy:
    max_per_switch: int = 2     # a localizing incident's two candidates share their spine
    min_spines: int = 1         # every leaf keeps at least this many spines towards every other leaf
    canary_weight: float = CANARY_WEIGHT   # the suspect uplink's weight while localizing; 1: no canary

    def validate(self) -> "MitigationPolicy":
        from netns_testbed.errors import SpecError

        if not 1 <= self.max_per_switch <= 64:
            raise SpecError(f"--max-drained-per-switch {self.max_per_switch}: between 1 and 64")
        if not 1 <= self.min_spines <= 64:
            raise SpecError(f"--min-spines {self.min_spines}: between 1 and 64")
        w = self.canary_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not finite(w) or not 0.01 <= w <= 1:
            shown = f"{w:g}" if isinstance(w, (int, float)) and not isinstance(w, bool) and finite(w) else repr(w)
            raise SpecError(f"--canary-weight {shown}: a number from 0.01 to 1 (1 keeps the suspect's full share; "
                            f"default {CANARY_WEIGHT:g})")
        return self


class Actuator(Protocol):
    """What carries a decision out. ``drain`` raises a UserError when the fabric refuses it."""

    def drain(self, links: list[Link], min_spines: int) -> None: ...

    def restore(self, links: list[Link]) -> None: ...

    def weigh(self, link: Link, weight: float) -> None: ...

    def drained(self) -> set[str]: ...


class TestbedActuator:
    """The testbed's spray tables (netns_testbed.drain)."""

    __test__ = False

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _tb(self):
        from netns_testbed.state import Testbed

        return Testbed.load(self.prefix)

    def drain(self, links: list[Link], min_spines: int) -> None:
        from netns_testbed import drain

        drain.drain(self._tb(), links, min_spines)

    def restore(self, links: list[Link]) -> None:
        from netns_testbed import drain

        drain.restore(self._tb(), links)

    def weigh(self, link: Link, weight: float) -> None:
        from netns_testbed import drain

        drain.set_weight(self._tb(), link, weight)

    def drained(self) -> set[str]:
        return set(self._tb().state.drained)


class Mitigator:
    """Incident events in, mitigation events out (see the module docstring)."""

    def __init__(self, fabric: Fabric, actuator: Actuator, policy: MitigationPolicy | None = None) -> None:
        self.fabric = fabric
        self.actuator = actuator
        self.policy = (policy or MitigationPolicy()).validate()
        self.mine: dict[str, str] = {}      # link drained by the policy -> the incident it was drained for
        self.canaries: dict[str, str] = {}  # uplink at its canary weight -> the incident
        self.released: set[tuple[str, str]] = set()   # (link, incident) an operator restored
        self.refused: set[tuple[str, str]] = set()    # (link, incident) refused once: said once
        self.actions: Counter[str] = Counter()
        self.history: list[dict] = []
        self.lock = threading.RLock()       # the poll loop acts, metrics scrapes read

    def on_incident(self, inc: dict) -> list[dict]:
        with self.lock:
            out = self._decide(inc)
            self.history.extend(out)
            trim_history(self.history)
            return out

    def _decide(self, inc: dict) -> list[dict]:
        if inc.get("event") not in ("open", "update", "localized", "resolved") or \
                inc.get("kind") not in (AlertKind.LOSS, AlertKind.CORRUPTION):
            return []
        self._forget_restored()
        iid = inc["incident_id"]
        out: list[dict] = []
        if inc["event"] == "resolved":
            self.released = {(l, i) for l, i in self.released if i != iid}
            self.refused = {(l, i) for l, i in self.refused if i != iid}
            if not inc.get("link"):
                for link in [l for l, owner in self.canaries.items() if owner == iid]:
                    out += self._full_weight(link, iid, "the incident resolved before a link was named")
            return out
        named = inc.get("link")
        if named:
            link = self.fabric.parse_link(named)
            if named not in self.mine and (named, iid) not in self.released and \
                    {node_kind(link.src), node_kind(link.dst)} == {"leaf", "spine"}:
                out += self._drain(link, iid, f"named by incident {iid}")
            for prev in [inc.get("previous_id"), iid]:
                for up in [l for l, owner in self.canaries.items() if owner == prev]:
                    why = "drained: it is the named link" if up == named else f"{named} was named: {up} is innocent"
                    out += self._full_weight(up, iid, why)
            return out
        cands = [self.fabric.parse_link(c) for c in inc.get("candidates") or []]
        ups = [c for c in cands if node_kind(c.src) == "leaf" and node_kind(c.dst) == "spine"]
        downs = [c for c in cands if node_kind(c.src) == "spine"]
        w = self.policy.canary_weight
        if len(ups) == 1 and len(downs) == 1 and ups[0].name not in self.canaries and w < 1:
            out += self._canary(ups[0], iid, f"a candidate of incident {iid}: {w:g} of its share "
                                             f"while the owners' verdicts come in")
        return out

    def _forget_restored(self) -> None:
        """An operator restored a link the policy drained: it is no longer the policy's, and the policy does
        not drain it again for the same incident (the operator's call; a new incident may)."""
        if self.mine:
            now = self.actuator.drained()
            for link in [l for l in self.mine if l not in now]:
                self.released.add((link, self.mine.pop(link)))

    def _canary(self, link: Link, iid: str, why: str) -> list[dict]:
        try:
            self.actuator.weigh(link, self.policy.canary_weight)
        except UserError as e:
            return [self._event("refused", link.name, iid, f"canary: {e}")]
        self.canaries[link.name] = iid
        return [self._event("canary", link.name, iid, why)]

    def _full_weight(self, name: str, iid: str, why: str) -> list[dict]:
        try:
            self.actuator.weigh(self.fabric.parse_link(name), 1.0)
        except UserError as e:
            return [self._event("refused", name, iid, f"full weight: {e}")]
        self.canaries.pop(name, None)
        return [self._event("canary_lifted", name, iid, why)]

    def _drain(self, link: Link, iid: str, why: str) -> list[dict]:
        """Drain ``link`` for incident ``iid``; a refusal is tried again at the incident's next event (a
        link may have been restored since) but reported once."""
        touched = Counter(n for name in self.mine for n in name.split("->"))
        full = [n for n in (link.src, link.dst) if touched[n] >= self.policy.max_per_switch]
        if full:
            return self._refused(link.name, iid, f"{', '.join(full)} already has "
                                 f"{self.policy.max_per_switch} link(s) drained by the policy")
        try:
            self.actuator.drain([link], self.policy.min_spines)
        except UserError as e:
            return self._refused(link.name, iid, str(e))
        self.mine[link.name] = iid
        return [self._event("drain", link.name, iid, why)]

    def _refused(self, link: str, iid: str, why: str) -> list[dict]:
        if (link, iid) in self.refused:
            return []
        self.refused.add((link, iid))
        return [self._event("refused", link, iid, why)]

    def _event(self, action: str, link: str, iid: str, why: str) -> dict:
        self.actions[action] += 1
        (log.warning if action == "refused" else log.info)("mitigation %s %s (incident %s): %s",
                                                           action, link, iid, why)
        return {"event": "mitigation", "action": action, "link": link, "incident_id": iid, "reason": why,
                "time": time.time()}

    def drained(self) -> dict[str, str]:
        """The links the policy drained that are still drained, each with its incident. A link an operator
        restored since is dropped here at once (not at the incident's next event): the
        ``flowpulse_link_drained`` series and the drain alert built on it end with the restore."""
        with self.lock:
            self._forget_restored()
            return dict(self.mine)

    def canary_weights(self) -> dict[str, tuple[str, float]]:
        """Each uplink held at a canary share: its incident and the weight it carries (the policy's)."""
        with self.lock:
            return {link: (iid, self.policy.canary_weight) for link, iid in self.canaries.items()}
