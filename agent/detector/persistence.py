"""A switch detector's state across restarts: what it learned (noise factors, shares), its CUSUMs and its
open alerts, saved as JSON (schema: state.schema.json; the daemon writes it every few pulses and at exit)
and loaded only by the detector of the same switch, fabric state and configuration."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from agent.detector.alerts import AlertBook, OpenAlert
from agent.detector.checks import Check
from agent.detector.config import DetectorConfig
from agent.detector.evidence import CusumBank, PoissonCusum
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, Link, SprayMode

STATE_VERSION = 6   # 4: verdict ledgers from sequence spans when the counts carry them (a spine's, a leaf's paths)
                    # 5: the links out of service beside the identity, not in it (a drain keeps what was learned)
                    # 6: a spine's verdict ledger per port and per (port, destination leaf): L + L*L cells
STATE_SCHEMA = Path(__file__).with_name("state.schema.json")   # the saved state's top level (save_state)


class ForeignState(ValueError):
    """A saved detector state of another switch, fabric state or configuration: not bad, not this one's."""


class Saved(Protocol):
    """What of a switch detector (agent.detector.switch.SwitchDetector) is saved and loaded."""

    switch: str
    fabric: Fabric
    spray: SprayMode
    cfg: DetectorConfig
    per_source: bool
    oos: list[Link]
    weights: dict[str, float]
    pulses_used: int
    checks: list[Check]
    banks: list[CusumBank]
    poisson: PoissonCusum
    book: AlertBook

    def set_out_of_service(self, oos: list[Link], weights: dict[str, float] | None = None) -> None: ...


def identity(det: Saved) -> dict:
    """What a saved state must match to be this detector's."""
    return {"version": STATE_VERSION, "switch": det.switch, "fabric": det.fabric.spec.to_dict(),
            "spray": str(det.spray), "config": det.cfg.to_dict(), "per_source": det.per_source}


def save_state(det: Saved) -> dict:
    return {"identity": identity(det), "out_of_service": sorted(l.name for l in det.oos), "weights": det.weights,
            "pulses_used": det.pulses_used,
            "banks": [b.state() for b in det.banks], "poisson": det.poisson.state(),
            "noise": [c.noise.state() for c in det.checks], "checks": [c.state() for c in det.checks],
            "open": {aid: oa.state() for aid, oa in det.book.open.items()}}


def load_state(det: Saved, d: dict) -> None:
    """Continue from a saved state; ForeignState if it belongs to another switch, fabric or setting,
    ValueError if it is damaged."""
    if d.get("identity") != identity(det):
        raise ForeignState("saved detector state is for another switch, fabric state or configuration")
    now, now_w = list(det.oos), dict(det.weights)
    try:
        then = det.fabric.parse_link_list(d["out_of_service"])
        then_w = {str(k): float(v) for k, v in dict(d["weights"]).items()}
    except SpecError as e:
        raise ValueError(f"saved links out of service: {e}") from None
    moved = {l.name for l in then} != {l.name for l in now} or then_w != now_w
    if moved:
        det.set_out_of_service(then, then_w)   # saved before a spray change: its learned shares are of then
    for b, s in zip(det.banks, d["banks"]):
        b.load(s)
    det.poisson.load(d["poisson"])
    for c, s in zip(det.checks, d["noise"]):
        c.noise.load(s)
    for c, s in zip(det.checks, d["checks"]):
        c.load(s)
    det.book.open = {aid: OpenAlert.from_state(s) for aid, s in d["open"].items()}
    det.pulses_used = int(d["pulses_used"])
    if moved:
        det.set_out_of_service(now, now_w)   # (the agent tells when the change was: follow_changes)
