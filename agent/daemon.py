"""The agent: per switch, read pulses, judge them, report.

Each :class:`SwitchAgent` owns one switch's reader and detector and nothing
else: no switch's agent sees another's counters. ``run_agents`` polls any
number of them in one loop (cheap: one syscall per switch while idle); the
CLI runs one process per switch or all in one.

Outputs: JSON-lines alert events (file and/or stdout), recorded pulses (for
offline replay), a Prometheus endpoint, structured logs on stderr.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from agent.deployment import Deployment, of_testbed
from agent.detector import Alert, DetectorConfig, SwitchDetector
from agent.detector.alerts import AlertEvent
from agent.detector.persistence import STATE_SCHEMA, ForeignState
from agent.faultcost import PulseLog
from agent.incidents import IncidentTracker, LocalEvidence, VerdictFiles, write_verdicts
from agent.pulse import PulseCounts
from agent.reader import testbed_reader
from netns_testbed import untrusted
from netns_testbed.safefiles import open_append, read_bounded, write_atomic
from netns_testbed.untrusted import REFUSED

if TYPE_CHECKING:
    from agent.mitigation import Mitigator
    from netns_testbed.state import Testbed

log = logging.getLogger("flowpulse.agent")
AGENT_NICE = -10  # the poller's nice value (needs root)
MAX_PULSES_PER_STEP = 64   # pulses of one switch read in a row before the loop goes on
# A poll that raises (a bug, a reader that fails) is logged with its traceback and counted
# (flowpulse_agent_errors_total), and the loop goes on with the next poll; this many in a row from one
# switch means it will not recover: run_agents raises, the agent exits and its service manager restarts it.
MAX_ERRORS_IN_ROW = 50


# what reading and loading a saved detector state raises when the file is not one this agent wrote
# (SwitchDetector.load_state walks nested parts the schema only outlines; OverflowError: an integer
# beyond the array's C type, such as an onset of 2**64)
BAD_STATE = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError)


def read_saved_state(path: Path) -> dict:
    """A saved detector state, checked before any of it is used: a regular file (no symlink, bounded),
    strict JSON, :data:`STATE_SCHEMA` at the top level. Raises one of :data:`BAD_STATE`."""
    d = untrusted.loads(read_bounded(path))
    untrusted.check(STATE_SCHEMA, d)
    return d


@dataclass
class AgentOptions:
    cfg: DetectorConfig
    alerts: Path | None = None          # JSON-lines alert events
    record: Path | None = None          # directory for pulses-<switch>.jsonl
    poll_s: float = 0.01
    export_verdicts: bool = False       # write this switch's verdict evidence for agents in other processes
                                        # (only a process that runs some of the switches needs it: a JSON
                                        # copy of the ledger per pulse, in the poll loop)
    persist: bool = True                # keep detector state in the deployment's state dir across restarts
    save_every: int = 10                # pulses between state saves (and at exit)


def check_switch(dep: Deployment, switch: str) -> None:
    if switch not in dep.fabric.switches:
        from netns_testbed.errors import SpecError

        raise SpecError(f"unknown switch {switch!r}: this fabric has {', '.join(dep.fabric.switches)}")


class SwitchAgent:
    """Reader + detector + outputs of one switch.

    ``dep`` says what the agent knows of the fabric (a testbed's state or a site file);
    ``reader`` yields the switch's pulses (anything with ``poll()``, ``close()`` and ``resyncs``).
    """

    def __init__(self, dep: Deployment, switch: str, opts: AgentOptions, reader,
                 sinks: list[Callable[[dict], None]] | None = None) -> None:
        check_switch(dep, switch)
        self.dep = dep
        self.switch = switch
        self.opts = opts
        self.reader = reader
        self.detector = self._make_detector()
        self._restore()
        self.change_seen: tuple[int, int | None] | None = None
        self.follow_changes()
        self.sinks = list(sinks or [])
        self.alerts_total: dict[str, int] = {}
        self.last_pulse: PulseCounts | None = None
        self.last_pulse_at: float | None = None   # time.monotonic() when the latest pulse was read
        self.pulse_log = PulseLog()               # the last pulses' rhythm: what an incident costs (faultcost)
        self.pulses = 0
        self.errors = 0            # polls that raised (run_agents)
        self.verdict_doc: str | None = None   # the latest exported verdict document (served at /verdicts/<switch>)
        self.errors_in_row = 0
        self.busy_s = 0.0
        self.last_poll = time.monotonic()   # the poll loop's heartbeat (/healthz)
        self.started_at = self.last_poll
        # held by the poll loop while it steps the detector, and by readers in other threads (metrics
        # scrapes) while they read it: a scrape sees one pulse's state, never one half-judged
        self.lock = threading.RLock()
        self._rec: TextIO | None = None
        if opts.record:
            self._rec = open_append(opts.record / f"pulses-{switch}.jsonl")

    @classmethod
    def on_testbed(cls, tb: "Testbed", switch: str, opts: AgentOptions, sinks: list[Callable[[dict], None]] | None = None,
                   degraded: list[str] | None = None) -> "SwitchAgent":
        """The agent of one testbed switch: its pinned maps, the testbed's state."""
        dep = of_testbed(tb, degraded)
        check_switch(dep, switch)  # before opening maps that do not exist
        return cls(dep, switch, opts, testbed_reader(tb, switch), sinks)

    def _make_detector(self) -> SwitchDetector:
        d = self.dep
        return SwitchDetector(d.fabric, self.switch, self.opts.cfg, d.spray, d.weights, list(d.out_of_service),
                              list(d.degraded), per_source=d.per_source)

    # -- detector state across restarts -------------------------------------------------
    @property
    def verdict_dir(self) -> Path:
        return self.dep.verdict_dir

    @property
    def state_path(self) -> Path:
        return self.dep.state_dir / f"{self.switch}.json"

    def _restore(self) -> None:
        """Continue from the state a previous agent of this switch saved (same fabric state and settings).
        A state file that is not one (a link, too large, not JSON, not :data:`STATE_SCHEMA`, or one whose
        parts do not load) is counted (``flowpulse_bad_input_total{source="state"}``) and the agent starts
        afresh."""
        if not self.opts.persist:
            return
        path = self.state_path
        try:
            self.detector.load_state(read_saved_state(path))
            log.info("%s: continuing from saved detector state (%d pulses, %d open alerts)", self.switch,
                     self.detector.pulses_used, len(self.detector.active))
        except FileNotFoundError:
            pass
        except ForeignState as e:
            log.warning("%s: saved detector state not used (%s): starting afresh", self.switch, e)
            self.detector = self._make_detector()
        except BAD_STATE as e:
            REFUSED.refuse("state", str(path), f"{type(e).__name__}: {e}")
            self.detector = self._make_detector()

    def save_state(self) -> None:
        if not self.opts.persist:
            return
        write_atomic(self.state_path, json.dumps(self.detector.state()))

    def accept(self) -> None:
        """The operator accepted the fabric's current state (out-of-service links, weights,
        spray mode; a testbed's state file or the site file read again): a detector built
        from it relearns from scratch."""
        self.dep = self.dep.reload()
        self.detector = self._make_detector()
        self.change_seen = None
        self.follow_changes()
        self.save_state()
        log.info("%s: accepted current fabric state of %s (spray %s, %d out of service); relearning",
                 self.switch, self.dep.name, self.dep.spray, len(self.dep.out_of_service))

    def follow_changes(self) -> None:
        """Take each drain, restore or weight change (the deployment's spray changes) as soon as it is
        recorded, in order: the detector judges every pulse by the shares of its time and skips the
        pulses a change crosses (SwitchDetector.reshare). At start, only the latest one's window counts
        (the detector was built with its shares)."""
        if self.dep.spray_changes is None:
            return
        changes = self.dep.spray_changes()
        if not changes:
            # none yet: every change from now on is new (left None, the first look that found two
            # changes took the latest alone, and the pulses between them were judged by the build's shares)
            self.change_seen = self.change_seen or (0, None)
            return
        start = self.change_seen is None
        seen_epoch, seen_t1 = self.change_seen or (changes[-1].epoch, None)
        new = [c for c in changes if c.epoch > seen_epoch or (c.epoch == seen_epoch and c.t1_ns != seen_t1)]
        if not start and changes[0].epoch > seen_epoch + 1:
            log.warning("%s: %d spray changes went by unread (the state keeps the latest %d): judging from the "
                        "latest", self.switch, changes[0].epoch - seen_epoch - 1, len(changes))
        for chg in new if not start else [changes[-1]]:
            self.detector.take(chg)
            if not start:
                log.info("%s: spray change %d (%s %s): %d link(s) out of service, %d weighted", self.switch,
                         chg.epoch, chg.action, ", ".join(l.name for l in chg.links), len(chg.out_of_service),
                         len(chg.weights))
        self.change_seen = (changes[-1].epoch, changes[-1].t1_ns)

    def step(self) -> list[Alert]:
        """Read the next closed pulse, if any, and run the detector on it. After a pause the
        kernel still holds the pulses it missed: call it again while :attr:`pulses` grows."""
        t0 = time.perf_counter()
        self.last_poll = time.monotonic()
        pc = self.reader.poll()
        events = self._observe(pc) if pc is not None else []
        self.busy_s += time.perf_counter() - t0
        return events

    def _observe(self, pc) -> list[Alert]:
        self.pulses += 1
        self.last_pulse = pc
        self.last_pulse_at = time.monotonic()
        self.pulse_log.add(pc.start_time, pc.span)
        if pc.nports != self.detector.nports:
            log.warning("%s: port count changed (%d -> %d): relearning", self.switch, self.detector.nports, pc.nports)
            self.detector = self._make_detector()
            self.change_seen = None      # a detector built with the latest shares: only that change's window counts
        self.follow_changes()   # after the pulse closed: a change that reached its packets is recorded by now
        events = self.detector.observe(pc)
        if events or self.pulses % self.opts.save_every == 0:
            self.save_state()
        if self.opts.export_verdicts:
            # the file for agents sharing verdict_dir, the document for those asking over HTTP (/verdicts/)
            self.verdict_doc = write_verdicts(self.verdict_dir, self.detector, self.dep.verdict_key)
        if self._rec:
            rec = pc.to_dict()
            rec["scores"] = {str(k): round(v, 3) for k, v in self.detector.port_scores().items()}
            self._rec.write(json.dumps(rec) + "\n")
            self._rec.flush()
        for ev in events:
            self.alerts_total[ev.kind] = self.alerts_total.get(ev.kind, 0) + (ev.event is AlertEvent.ALERT)
            d = ev.to_dict()
            log.warning("%s %s: port %d (%s) %s link=%s candidates=%s rate=%.4f score=%.2f window=%d",
                        ev.event, ev.kind, ev.port, ev.ifname, ev.switch, ev.link, ",".join(ev.candidates),
                        ev.estimated_rate, ev.score, ev.window)
            for sink in self.sinks:
                sink(d)
        return events

    def close(self) -> None:
        try:
            self.save_state()
        except OSError as e:  # the testbed went down under us
            log.debug("%s: detector state not saved: %s", self.switch, e)
        self.reader.close()
        if self._rec:
            self._rec.close()


class JsonLinesSink:
    """Appends events to a file (and optionally stdout), one JSON object a line.

    The file is reopened when it was moved or removed (logrotate without copytruncate): the
    next event goes to a new file at the same path, nothing is written to the rotated one."""

    def __init__(self, path: Path | None, stdout: bool = False) -> None:
        self.lock = threading.Lock()
        self.path = path
        self.f = open_append(path) if path else None
        self.stdout = stdout

    def _current(self) -> TextIO | None:
        if self.f is None or self.path is None:
            return self.f
        try:
            same = os.stat(self.path).st_ino == os.fstat(self.f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            self.f.close()
            self.f = open_append(self.path)
        return self.f

    def __call__(self, event: dict) -> None:
        line = json.dumps(event, default=float)
        with self.lock:
            f = self._current()
            if f:
                f.write(line + "\n")
                f.flush()
            if self.stdout:
                print(line, flush=True)

    def close(self) -> None:
        if self.f:
            self.f.close()


def make_tracker(agents: list[SwitchAgent], reporter: str | None = None) -> IncidentTracker:
    """The incident tracker for agents in this process: their own verdicts in memory, other switches'
    from the verdict files their agents export."""
    local = LocalEvidence(lambda: {a.switch: a.detector for a in agents})
    dep = agents[0].dep
    if dep.peers is not None:
        from agent.verdictpeers import VerdictPeers

        return IncidentTracker(dep.fabric, VerdictPeers(dep.peers, local, key=dep.verdict_key), reporter)
    return IncidentTracker(dep.fabric, VerdictFiles(agents[0].verdict_dir, local, key=dep.verdict_key), reporter)


class SignalEvent(threading.Event):
    """An event a signal handler can set. ``Event.set()`` takes the event's lock, and a handler runs in
    the main thread between two of its bytecodes, possibly inside that same event's ``wait()`` while it
    holds the lock: setting it there deadlocks the process (an agent SIGTERMed inside ``stop.wait()``
    never exited and had to be SIGKILLed; a loop on ``stop.wait(0)`` hangs at the first few SIGTERMs).
    ``set_from_signal()`` is a plain store that ``is_set()`` reads: no lock, and the waiter sees it when
    its ``wait()`` returns (``run_agents`` waits ``poll_s``). tests/test_signals.py."""

    def __init__(self) -> None:
        super().__init__()
        self.signalled = False

    def set_from_signal(self) -> None:
        self.signalled = True

    def is_set(self) -> bool:
        return self.signalled or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.signalled or super().wait(timeout) or self.signalled

    def clear(self) -> None:
        self.signalled = False
        super().clear()


IDLE_WAIT_S = 1.0    # the longest sleep while no pulse is open: the kernel's wake-up is the real signal, and a
                     # signal (SIGTERM, SIGHUP) wakes the loop at once (Waker); this bounds how late a
                     # stop set from another thread is seen


def sleep_for(agents: list[SwitchAgent], poll_s: float, now_ns: int) -> float:
    """How long the loop may sleep: until the earliest open pulse can have closed (its reader's wake_ns);
    ``poll_s`` for a reader that cannot be woken (no ring: it polls the clock); else IDLE_WAIT_S."""
    wait = IDLE_WAIT_S
    for a in agents:
        r = a.reader
        wake = getattr(r, "wake_ns", None)
        if wake is not None:
            wait = min(wait, max(0.0, (wake - now_ns) / 1e9))
        elif getattr(r, "wake_fd", None) is None:
            wait = min(wait, poll_s)
    return max(wait, 0.001)


class Waker:
    """epoll on the readers' "a pulse opened" rings: ``wait`` returns at the first wake-up or the timeout,
    and re-arms the rings that woke it."""

    def __init__(self, agents: list[SwitchAgent]) -> None:
        import select

        self.ep = select.epoll()
        self.agents = agents
        self.fds: dict[tuple[int, int], SwitchAgent] = {}
        self.refresh()
        # in the main thread, a signal wakes the loop at once (its handler runs, then the loop sees what it set)
        self.pipe: tuple[int, int] | None = None
        self.old_wakeup = -1
        if threading.current_thread() is threading.main_thread():
            self.pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self.old_wakeup = signal.set_wakeup_fd(self.pipe[1], warn_on_full_buffer=False)
            self.ep.register(self.pipe[0], select.EPOLLIN)

    def refresh(self) -> None:
        """Follow readers whose rings changed (maps replaced by a reload: the reader reopened them)."""
        import select

        # keyed by the ring object too: a reopened ring may get the number of the one closed before it
        want = {(fd, id(a.reader.maps)): a for a in self.agents
                if (fd := getattr(a.reader, "wake_fd", None)) is not None}
        if want.keys() == self.fds.keys():
            return
        for fd, _ in self.fds.keys() - want.keys():
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass                      # closed with its maps: epoll dropped it already
        for fd, _ in want.keys() - self.fds.keys():
            try:
                self.ep.register(fd, select.EPOLLIN)
            except FileExistsError:       # the same number, re-registered for the ring now behind it
                self.ep.modify(fd, select.EPOLLIN)
        self.fds = want

    def wait(self, timeout: float) -> None:
        self.refresh()
        woke = {fd for fd, _ in self.ep.poll(timeout)}
        for (fd, _), a in self.fds.items():
            if fd in woke:
                a.reader.woken()
        if self.pipe is not None and self.pipe[0] in woke:
            try:
                while os.read(self.pipe[0], 512):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.pipe is not None:
            signal.set_wakeup_fd(self.old_wakeup)
            for fd in self.pipe:
                os.close(fd)
            self.pipe = None
        self.ep.close()


def _catch_up(a: SwitchAgent, tracker: IncidentTracker | None, publish: Callable[[list[dict]], None]) -> int:
    """Read and judge ``a``'s closed pulses (up to MAX_PULSES_PER_STEP, one per lock hold: scrapes get in
    between); their alerts go to ``tracker``. Returns how many were read (MAX_PULSES_PER_STEP: maybe more
    wait)."""
    read = 0
    while read < MAX_PULSES_PER_STEP:
        n = a.pulses
        with a.lock:
            events = a.step()
        if tracker is not None:
            for ev in events:
                with tracker.lock:
                    publish(tracker.feed(ev, now=time.time()))
        if a.pulses == n:
            break
        read += 1
    return read


def run_agents(agents: list[SwitchAgent], stop: threading.Event, poll_s: float = 0.01,
               on_tick: Callable[[list[SwitchAgent]], None] | None = None, tick_s: float = 1.0,
               tracker: IncidentTracker | None = None,
               incident_sinks: list[Callable[[dict], None]] | None = None,
               mitigator: "Mitigator | None" = None) -> None:
    """Poll every agent until ``stop`` is set; SIGHUP means "accept the current fabric state".

    The kernel keeps the last pulses of each switch (a ring), so a poller that
    sleeps through several reads them all when it wakes; it still raises its own
    priority so that alerts come as soon as a pulse closes on a box whose cores are
    busy with the training job.

    Every alert event goes to ``tracker``; its incident events to ``incident_sinks`` and to
    ``mitigator``, whose actions (agent.mitigation) go to ``incident_sinks`` too.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), AGENT_NICE)
    except (PermissionError, OSError):
        log.debug("could not raise the poller's priority (not root?)")
    hup = SignalEvent()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda *_: hup.set_from_signal())
    next_tick = time.monotonic() + tick_s
    sinks = list(incident_sinks or [])
    waker = Waker(agents)
    if not waker.fds:
        waker.close()
        waker = None

    def publish(incs: list[dict]) -> None:
        for inc in incs:
            log.warning("incident %s %s: %s (%s)", inc["event"], inc["incident_id"], inc["state"], inc["how"])
            for sink in sinks:
                sink(inc)
            for act in mitigator.on_incident(inc) if mitigator is not None else ():
                for sink in sinks:
                    sink(act)

    try:
        _loop(agents, stop, hup, tracker, publish, poll_s, on_tick, tick_s, next_tick, waker)
    finally:
        if waker is not None:
            waker.close()


def _loop(agents, stop, hup, tracker, publish, poll_s, on_tick, tick_s, next_tick, waker) -> None:
    """run_agents' loop: catch every agent up, then sleep until a pulse opens (the kernel's ring), an open
    one can have closed (sleep_for), the next tick, or IDLE_WAIT_S."""
    while not stop.is_set():
        if hup.is_set():
            hup.clear()
            for a in agents:
                with a.lock:
                    a.accept()
        pulsed = more = False
        for a in agents:
            try:
                read = _catch_up(a, tracker, publish)
                pulsed |= read > 0
                more |= read == MAX_PULSES_PER_STEP     # the cap, not the end: look again at once
                a.errors_in_row = 0
            except RuntimeError:
                raise                    # the counters are gone (the testbed went down): the caller's to say
            except Exception:
                a.errors += 1
                a.errors_in_row += 1
                log.exception("%s: poll failed (%d in a row, %d in all); going on with the next pulse", a.switch,
                              a.errors_in_row, a.errors)
                if a.errors_in_row >= MAX_ERRORS_IN_ROW:
                    raise
        if tracker is not None and pulsed and tracker.alerts:
            with tracker.lock:
                publish(tracker.tick(time.time()))
        if on_tick and time.monotonic() >= next_tick:
            on_tick(agents)
            next_tick = time.monotonic() + tick_s
        timeout = 0.0 if more else sleep_for(agents, poll_s, time.monotonic_ns())
        if on_tick:
            timeout = min(timeout, max(0.0, next_tick - time.monotonic()))
        if waker is None or stop.is_set():
            stop.wait(timeout)
        else:
            waker.wait(timeout)
