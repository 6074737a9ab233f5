"""Drain and restore leaf-spine links of a running testbed, and weigh its uplinks: the leaves stop (or
start again, or go on at another share) spraying over them, while jobs run.

A drained ``leafA->spineK`` takes spine K out of leaf A's tables towards every leaf; a drained
``spineK->leafL`` takes spine K out of every leaf's table towards leaf L (the packets for L's hosts
would cross it). ``a<->b`` drains both directions. Each leaf's tables switch at once (a second bank
is filled, then one word flips: bpf/switch.h, struct fp_spray); all leaves switch within the change's
window, which the state file records before the first flip and closes after the last, so that the
agents judge no pulse sprayed both ways (agent.detector.SwitchDetector.reshare).

Refused with one line, nothing changed: a host link, and a drain that would leave some leaf fewer
than ``min_spines`` spines towards some other leaf (``Fabric.check_drain``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from netns_testbed.errors import StateError
from netns_testbed.state import Testbed, change_to_dict, write_state
from netns_testbed.topo import Link, SprayChange, node_kind

log = logging.getLogger("flowpulse.testbed")
MAX_CHANGES = 32      # spray changes the state file keeps: an agent takes each one since it last looked
                      # (SwitchAgent.follow_changes); one further behind judges from the latest


def drain(tb: Testbed, links: Iterable[Link], min_spines: int = 1) -> SprayChange | None:
    """Take ``links`` out of the spray tables; None if they all were drained already."""
    links = list(links)
    with tb.locked():
        tb.fabric.check_drain(tb.out_of_service, links, min_spines)
        new = {l.name for l in links} - set(tb.state.drained)
        if not new:
            return None
        return _switch(tb, "drain", tb.fabric.links_named(new), set(tb.state.drained) | new)


def restore(tb: Testbed, links: Iterable[Link] | None = None) -> SprayChange | None:
    """Put drained ``links`` (None: all) back into the spray tables; None if none of them was drained.
    A link out of service since the build stays out (``fabric up --out-of-service``)."""
    with tb.locked():
        drained = set(tb.state.drained)
        want = drained if links is None else {l.name for l in links}
        for name in sorted(want - drained):
            log.info("%s was not drained: nothing to restore", name)
        back = want & drained
        if not back:
            return None
        return _switch(tb, "restore", tb.fabric.links_named(back), drained - back)


def set_weight(tb: Testbed, link: Link, weight: float) -> SprayChange | None:
    """Spray ``weight`` times an uplink's usual share over ``leafL->spineK`` (1: as built without
    weights); None if it already is. The mitigation's canary: a suspect uplink keeps a small share, so
    that its owner's evidence keeps coming while most of the traffic goes around it."""
    from netns_testbed.errors import SpecError

    if not (0 < weight <= 1000) or node_kind(link.src) != "leaf" or node_kind(link.dst) != "spine":
        raise SpecError(f"weight {weight!r} on {link.name}: a weight in (0, 1000] on a leaf->spine uplink")
    with tb.locked():
        weights = dict(tb.state.weights)
        if abs(weights.get(link.name, 1.0) - weight) < 1e-12:
            return None
        if abs(weight - 1.0) < 1e-12:
            weights.pop(link.name, None)
        else:
            weights[link.name] = weight
        return _switch(tb, "weight", [link], set(tb.state.drained), weights)


def _switch(tb: Testbed, action: str, links: list[Link], drained: set[str],
            weights: dict[str, float] | None = None) -> SprayChange:
    """Record the change, flip every leaf's tables, close the change's window (under the state lock)."""
    if not tb.state.datapath:
        raise StateError(f"testbed {tb.prefix!r} runs without the eBPF datapath: no spray tables to change")
    st = tb.state
    before, before_w = list(st.drained), dict(st.weights)
    st.drained = sorted(drained)
    if weights is not None:
        st.weights = dict(weights)
    st.epoch += 1
    rec = {"epoch": st.epoch, "action": action, "links": [l.name for l in links],
           "out_of_service": [l.name for l in tb.out_of_service], "t0_ns": time.monotonic_ns(), "t1_ns": None,
           "weights": dict(st.weights)}
    st.changes = (st.changes + [rec])[-MAX_CHANGES:]
    write_state(st)                   # before the first flip: an agent that reads a pulse sprayed anew sees it
    try:
        _flip(tb, tb.out_of_service)
    except BaseException:
        st.drained, st.weights = before, before_w   # every leaf back as it was; the window covers both
        _flip(tb, tb.out_of_service)
        rec["t1_ns"] = time.monotonic_ns()
        rec["out_of_service"] = [l.name for l in tb.out_of_service]
        rec["weights"] = dict(st.weights)
        write_state(st)
        raise
    rec["t1_ns"] = time.monotonic_ns()
    write_state(st)
    change = tb.latest_change
    assert change is not None
    log.info("%s %s: %d link(s) out of service, leaves switched in %.2f ms", action, ", ".join(rec["links"]),
             len(change.out_of_service), (rec["t1_ns"] - rec["t0_ns"]) / 1e6)
    return change


def _flip(tb: Testbed, out_of_service: list[Link]) -> None:
    for leaf in tb.fabric.leaves:
        m = tb.maps(leaf)
        try:
            m.set_spray(tb.state.weights, out_of_service)
        finally:
            m.close()


def as_dict(change: SprayChange | None) -> dict | None:
    return None if change is None else change_to_dict(change)
