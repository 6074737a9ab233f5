"""The agent's full-screen terminal view (``flowpulse agent --live``), drawn with rich.

One screen: per switch its pulses, state, worst port and that port's score against
the threshold (a bar: the alarm is at 1.0), its open alerts; then the open
incidents; then the last log lines. Log records go into the view's own panel
while it is up (a handler replaces the stderr one), so no log line tears the
screen; they are back on stderr when the view closes.
"""
from __future__ import annotations

import collections
import logging
import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

LOG_LINES = 8
BAR = 20


def score_bar(score: float) -> Text:
    """The score against the threshold (1.0): filled up to it, red past it."""
    filled = min(BAR, int(round(min(score, 1.0) * BAR)))
    style = "bold red" if score >= 1.0 else "yellow" if score >= 0.5 else "green"
    return Text("█" * filled, style=style) + Text("·" * (BAR - filled), style="dim") + Text(f" {score:5.2f}")


def render(agents, tracker=None, log_lines: list[str] | None = None):
    """The screen as a rich renderable (``agents``: agent.daemon.SwitchAgent)."""
    sw = Table(title=f"FlowPulse  {time.strftime('%H:%M:%S')}   (Ctrl-C to stop)", expand=True, title_justify="left")
    for col, kw in (("switch", {}), ("pulses", {"justify": "right"}), ("state", {}), ("worst port", {}),
                    ("score / threshold", {}), ("alerts", {"overflow": "fold"})):
        sw.add_column(col, **kw)
    for a in agents:
        det = a.detector
        scores = det.port_scores()
        worst = max(scores.items(), key=lambda kv: kv[1]) if scores else None
        alerts = [f"{oa.alert.kind} {oa.alert.link or ' | '.join(oa.alert.candidates)} "
                  f"{oa.alert.estimated_rate:.2%}" for oa in list(det.active.values())]
        port = f"{worst[0]} ({a.dep.fabric.port(a.switch, worst[0]).ifname})" if worst else "-"
        sw.add_row(a.switch, str(a.pulses), "learning" if det.warming_up else "watching", port,
                   score_bar(worst[1] if worst else 0.0),
                   Text("\n".join(alerts), style="bold red") if alerts else Text("-", style="dim"))
    parts = [sw]
    if tracker is not None:
        inc = Table(title="incidents", expand=True, title_justify="left")
        for col in ("incident", "state", "kind", "rate", "how"):
            inc.add_column(col, justify="right" if col == "rate" else "left")
        for i in tracker.open():
            inc.add_row(i.incident_id, Text(i.state, style="bold red" if i.state == "localized" else "yellow"),
                        i.kind, f"{i.rate:.2%}", i.how)
        if not tracker.open():
            inc.add_row("-", "", "", "", "")
        parts.append(inc)
    if log_lines is not None:
        parts.append(Panel("\n".join(log_lines) or " ", title="log", title_align="left", border_style="dim"))
    return Group(*parts)


def render_text(agents, tracker=None, width: int = 140) -> str:
    """The screen as plain text (tests, and terminals without colour)."""
    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(render(agents, tracker))
    return console.export_text()


class _Ring(logging.Handler):
    def __init__(self, lines: collections.deque) -> None:
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class LiveScreen:
    """Full screen while the agents run: ``with LiveScreen(tracker) as screen: ... screen.update(agents)``."""

    def __init__(self, tracker=None) -> None:
        self.tracker = tracker
        self.lines: collections.deque = collections.deque(maxlen=LOG_LINES)
        self.live = Live(console=Console(), screen=True, auto_refresh=False, transient=True)
        self._saved: list[logging.Handler] = []

    def __enter__(self) -> "LiveScreen":
        root = logging.getLogger()
        self._saved = list(root.handlers)
        for h in self._saved:
            root.removeHandler(h)
        root.addHandler(_Ring(self.lines))
        self.live.__enter__()
        return self

    def update(self, agents) -> None:
        self.live.update(render(agents, self.tracker, list(self.lines)), refresh=True)

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in self._saved:
            root.addHandler(h)
