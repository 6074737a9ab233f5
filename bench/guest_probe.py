"""A pytest plugin that says, after each test, what is still running that the test started and what used
the CPU while it ran: for finding why a test is slow late in a long run (in the guest, where nothing else
can be looked at while it runs) and never alone.

  sudo .venv/bin/python bench/kernel_matrix.py --probe --resume ~/matrix       # in the guest's pytest.log
  sudo .venv/bin/python -m pytest -p bench.guest_probe tests/test_wakeups.py   # here

After each test, one line in pytest's output (``probe: ...``): the processes born during the test that
outlive it (pid, name, CPU seconds, command line), the threads of pytest's own process that the test
started and left alive, the three processes that used the most CPU during it (of those alive at its end:
a job's ranks have gone by then), and the machine's state after it: the load average, the memory
available, and its pace, the time of netns_testbed/slowdown.py's loop (one round) against the same
loop's time when pytest started (``pace 1.0``: as fast as then; ``pace 3.0``: three times slower). It
reads ``/proc`` and runs that loop; it changes nothing a test does.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from netns_testbed.slowdown import cpu_seconds

TICK = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[str, float, str]]:
    """pid -> (name, CPU seconds so far, command line) of every process ``/proc`` shows."""
    out: dict[int, tuple[str, float, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK           # utime + stime
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
        except (OSError, ValueError, IndexError):
            continue
        out[int(d.name)] = (name, cpu, cmd)
    return out


def available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return -1


class Probe:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.before: dict[int, tuple[str, float, str]] = {}
        self.threads: set[int] = set()
        self.t0 = 0.0
        self.loop_s = cpu_seconds(rounds=1)     # the pace pytest started at

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid, location):
        self.before = processes()
        self.threads = {t.ident for t in threading.enumerate()}
        self.t0 = time.monotonic()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid, location):
        after = processes()
        me = os.getpid()
        born = [(pid, *after[pid]) for pid in sorted(after) if pid not in self.before and pid != me
                and after[pid][2]]           # a kernel thread has no command line
        left = [t for t in threading.enumerate() if t.ident not in self.threads]
        used = sorted(((after[p][1] - self.before.get(p, (None, 0.0))[1], p, after[p][0]) for p in after),
                      reverse=True)[:3]
        took = time.monotonic() - self.t0
        parts = []
        if born:
            parts.append("left running: " + "; ".join(f"{pid} {name} {cpu:.1f} s cpu: {cmd}"
                                                      for pid, name, cpu, cmd in born[:8]))
        if left:
            parts.append("threads left: " + ", ".join(t.name for t in left[:8]))
        parts.append(f"{took:.0f} s, most cpu: " + ", ".join(f"{name}[{pid}] {cpu:.0f} s" for cpu, pid, name in used))
        parts.append(f"load {os.getloadavg()[0]:.1f}, {available_mib()} MiB available, "
                     f"pace {cpu_seconds(rounds=1) / self.loop_s:.1f}")
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:        # on a line of its own: the progress dots before it stay a line of dots
            tr.write("\n")
            tr.write_line(f"probe: {nodeid}: " + " | ".join(parts))
            tr.flush()            # pytest's output is a file in the guest: a guest killed later keeps the line


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Probe(config), "flowpulse-guest-probe")
