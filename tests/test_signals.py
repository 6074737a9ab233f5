"""A stop event set from a signal handler (the agent's SIGTERM and SIGHUP) must never deadlock.

A child loops on ``stop.wait(0)`` (it holds the event's lock most of the time, the worst case of the
agent's ``stop.wait(poll_s)``) and acknowledges each stop; the parent sends SIGTERM after each
acknowledgement. ``Event.set()`` in the handler deadlocks the child within a few signals (the control);
``agent.daemon.SignalEvent.set_from_signal`` must survive all of them.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import signal, sys, threading
from agent.daemon import SignalEvent
if sys.argv[1] == "direct":
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
else:
    stop = SignalEvent()
    signal.signal(signal.SIGTERM, lambda *_: stop.set_from_signal())
print("ready", flush=True)
while True:
    stop.wait(0)
    if stop.is_set():
        stop.clear()
        print("stopped", flush=True)
"""


def stops_acknowledged(how: str, signals: int, timeout: float = 5.0) -> int:
    """How many SIGTERMs in a row the child acknowledged before it stopped answering (or all)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, how], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout.readline() == "ready\n"
        for n in range(signals):
            child.send_signal(signal.SIGTERM)
            ready, _, _ = select.select([child.stdout], [], [], timeout)
            if not ready or child.stdout.readline() != "stopped\n":
                return n
        return signals
    finally:
        child.kill()
        child.wait()


def test_setting_the_event_in_the_handler_deadlocks():
    """The control: the bug this guards against is real on this interpreter."""
    t = time.monotonic()
    assert stops_acknowledged("direct", 300, timeout=2.0) < 300
    assert time.monotonic() - t < 60


def test_set_from_signal_never_deadlocks():
    assert stops_acknowledged("flag", 300) == 300
