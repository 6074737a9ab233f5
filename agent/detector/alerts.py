"""Typed alerts and the book of open ones.

An alert is keyed by ``switch/port/direction/kind``: several cells (one per
source leaf through that port) feed one alert, so one fault raises one alert
per switch that sees it. Its lifecycle: ``alert`` when a CUSUM first crosses
its threshold, ``update`` when the named link or the rate estimate changes
(or every ``update_every`` pulses while it lasts), ``resolved`` when the
repair test has seen the evidence its budget asks that the loss is gone
(:class:`agent.detector.evidence.Repair`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum

from agent.detector.evidence import Repair


class AlertKind(str, Enum):
    """What an alert says is wrong."""

    LOSS = "loss"                # packets missing (a check's deficit)
    CORRUPTION = "corruption"    # damaged frames arriving
    ASYMMETRY = "asymmetry"      # learned shares that contradict the fabric model (at start)

    def __str__(self) -> str:
        return self.value


class AlertEvent(str, Enum):
    """An alert's lifecycle: raised, changed, gone."""

    ALERT = "alert"
    UPDATE = "update"
    RESOLVED = "resolved"

    def __str__(self) -> str:
        return self.value


class CheckKind(str, Enum):
    """Which test raised a loss alert (its evidence's ``test``)."""

    PEER = "peer"                # a leaf's uplinks against each other, per source leaf
    SPINE = "spine"              # a spine's balance per port
    HOST = "host"                # a leaf's host ports against each other
    CORRUPTION = "corruption"    # damaged frames against the link's background rate
    SHARES = "learned-vs-analytic shares"

    def __str__(self) -> str:
        return self.value


@dataclass(kw_only=True)
class Alert:
    """An alert event as written to alerts.jsonl and report.json (members written by their values). Built
    by keyword; a record read back needs its identity (event, id, time, switch, port, kind), the rest
    has defaults."""

    event: AlertEvent
    alert_id: str
    time: float
    switch: str
    port: int
    ifname: str = ""
    direction: str = "in"
    link: str | None = None     # the one directed link, when this switch can name it alone
    candidates: list[str] = field(default_factory=list)
    kind: AlertKind
    estimated_rate: float = 0.0
    rate_ci: list[float] = field(default_factory=lambda: [0.0, 0.0])
    score: float = 0.0          # CUSUM statistic / threshold (>= 1 at an alarm)
    window: int = 0             # pulses since the estimated onset
    pulse: int = 0
    pulse_start: float = 0.0
    onset_pulse: int = 0        # the pulse the CUSUM puts the change at
    onset_time: float = 0.0
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.event = AlertEvent(self.event)     # typed once, also when read back from a file
        self.kind = AlertKind(self.kind)

    @property
    def test(self) -> CheckKind | None:
        """The check that raised it (None: an older record without one)."""
        t = (self.evidence or {}).get("test")
        return CheckKind(t) if t in CheckKind._value2member_map_ else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Alert":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def as_event(self, event: AlertEvent, **changes) -> "Alert":
        return Alert(**{**asdict(self), "event": event, **changes})


@dataclass
class OpenAlert:
    alert: Alert                                   # the last event published
    cells: set[tuple[int, tuple]]                  # (check index, cell index) that alarmed
    repair: Repair = field(default_factory=Repair)  # the repair test
    last_event_pulse: int = 0
    ref_rate: float = 0.0                          # largest rate estimated while open: the damaged-frame
                                                   # cells' repair alternative, and the loss cells' until a
                                                   # pulse is judged

    def state(self) -> dict:
        return {"alert": self.alert.to_dict(), "cells": [[i, list(c)] for i, c in sorted(self.cells)],
                **self.repair.state(), "last_event_pulse": self.last_event_pulse, "ref_rate": self.ref_rate}

    @classmethod
    def from_state(cls, d: dict) -> "OpenAlert":
        return cls(Alert.from_dict(d["alert"]), {(int(i), tuple(c)) for i, c in d["cells"]}, Repair.from_state(d),
                   int(d["last_event_pulse"]), float(d["ref_rate"]))


class AlertBook:
    def __init__(self, update_every: int) -> None:
        self.update_every = update_every
        self.open: dict[str, OpenAlert] = {}

    def publish(self, alert: Alert, cells: set[tuple[int, tuple]], pulse: int) -> Alert | None:
        """Record an alarm; return the event to publish (alert or update), if any."""
        cur = self.open.get(alert.alert_id)
        if cur is None:
            self.open[alert.alert_id] = OpenAlert(alert, set(cells), Repair(), pulse, alert.estimated_rate)
            return alert
        cur.cells |= cells
        cur.ref_rate = max(cur.ref_rate, alert.estimated_rate)
        old = cur.alert
        if alert.link is None and old.link:
            alert = alert.as_event(alert.event, link=old.link)
        changed = (alert.link != old.link or abs(alert.estimated_rate - old.estimated_rate)
                   > max(0.2 * old.estimated_rate, 0.001) or pulse - cur.last_event_pulse >= self.update_every)
        if not changed:
            return None
        ev = alert.as_event(AlertEvent.UPDATE)
        cur.alert, cur.last_event_pulse = ev, pulse
        return ev

    def resolve(self, aid: str, time: float, pulse: int, pulse_start: float) -> Alert:
        cur = self.open.pop(aid)
        return cur.alert.as_event(AlertEvent.RESOLVED, time=time, pulse=pulse, pulse_start=pulse_start, score=0.0, window=0,
                                  evidence={})
