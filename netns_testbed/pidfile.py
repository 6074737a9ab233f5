"""Pid files that prove whose process they name.

A pid file holds ``<pid> <start time> <note>``: the start time is the kernel's
(``/proc/<pid>/stat`` field 22, clock ticks since boot), so a pid reused by an
unrelated process after ours died (a stale file left by SIGKILL) does not match,
and nobody else's process is ever signalled. The check and the signal go through
a pidfd (pidfd_open(2)), so the pid cannot be reused between the two.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and ")": the fields after its last ")" start at field 3
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def write(path: Path, note: str = "", pid: int | None = None) -> None:
    """Write ``path`` for this process (or ``pid``); exclusive: an existing file is an error."""
    pid = os.getpid() if pid is None else pid
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{pid} {start_ticks(pid)} {note}".rstrip() + "\n")


def read(path: Path) -> tuple[int, int] | None:
    """(pid, start ticks) from a pid file, None if it does not parse."""
    try:
        pid, start = path.read_text().split()[:2]
        return int(pid), int(start)
    except (OSError, ValueError):
        return None


def open_owned(path: Path) -> int | None:
    """A pidfd for the process ``path`` names, only if it is still that process (same start time)."""
    entry = read(path)
    if entry is None:
        return None
    pid, start = entry
    try:
        pfd = os.pidfd_open(pid)
    except OSError:
        return None
    if start_ticks(pid) != start:      # checked after the pidfd holds the pid: no reuse in between
        os.close(pfd)
        return None
    return pfd


def kill_owned(paths: list[Path], grace: float = 0.5) -> list[int]:
    """SIGTERM, then after ``grace`` seconds SIGKILL, each process a pid file names and still owns;
    returns the pids signalled. Stale files (dead or reused pids) are removed."""
    held: dict[int, int] = {}
    for p in paths:
        pfd = open_owned(p)
        if pfd is None:
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        held[pfd] = read(p)[0]
    try:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            live = [pfd for pfd in held if not _exited(pfd)]
            for pfd in live:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pfd, sig)
            deadline = time.monotonic() + wait
            while live and time.monotonic() < deadline:
                select.select(live, [], [], max(0.0, deadline - time.monotonic()))
                live = [pfd for pfd in live if not _exited(pfd)]
            if not live:
                break
        return sorted(held.values())
    finally:
        for pfd in held:
            os.close(pfd)


def _exited(pfd: int) -> bool:
    """A pidfd polls readable once its process has exited."""
    return bool(select.select([pfd], [], [], 0)[0])
