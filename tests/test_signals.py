"""A stop event set from a signal handler (the agent's SIGTERM and SIGHUP) must never deadlock.

Two children. The first sends itself SIGTERM while it holds the event's lock, the moment ``wait()``
holds it: the handler runs there, between two bytecodes, every time. ``Event.set()`` in the handler then
waits for a lock its own thread holds and the child hangs (the control, deterministic);
``agent.daemon.SignalEvent.set_from_signal`` must return. The second loops on ``stop.wait(0)`` (the
agent's ``stop.wait(poll_s)`` at its tightest) and acknowledges each stop while the parent sends 300
SIGTERMs: where they land is up to the scheduler, so this one has no control (on this 2-core machine
``Event.set()`` hung at the first few; on CI's machine it once survived all 300).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The children's common start: a stop event that SIGTERM sets, directly (argv "direct") or the agent's way.
HANDLER = r"""
import os, signal, sys, threading
from agent.daemon import SignalEvent
if sys.argv[1] == "direct":
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
else:
    stop = SignalEvent()
    signal.signal(signal.SIGTERM, lambda *_: stop.set_from_signal())
"""

INSIDE_THE_LOCK = HANDLER + r"""
with stop._cond:                      # the lock Event.wait() holds
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100000):           # the handler runs between two of these bytecodes
        pass
print("stopped" if stop.is_set() else "missed", flush=True)
"""


def signal_inside_the_lock(how: str, timeout: float = 10.0) -> str:
    """What the child printed after a SIGTERM landed while it held the event's lock ("" if it hung)."""
    child = subprocess.Popen([sys.executable, "-c", INSIDE_THE_LOCK, how], cwd=REPO, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        out, _ = child.communicate(timeout=timeout)
        return out.strip()
    except subprocess.TimeoutExpired:
        return ""
    finally:
        child.kill()
        child.wait()


CHILD = HANDLER + r"""
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
    """The control: a signal inside wait()'s lock hangs a handler that calls Event.set()."""
    assert hasattr(threading.Event(), "_cond"), "Event's lock moved: update INSIDE_THE_LOCK"
    assert signal_inside_the_lock("direct", timeout=3.0) == ""


def test_set_from_signal_inside_the_lock_returns():
    assert signal_inside_the_lock("flag") == "stopped"


def test_set_from_signal_never_deadlocks():
    assert stops_acknowledged("flag", 300) == 300
