"""Site agents on a running testbed: each switch namespace stands for a machine.

One ``flowpulse agent --site`` process per switch, started inside the switch's
namespace from the site file ``fabric export-site`` wrote, with its run
directory pointed at an empty one so that any read of testbed state would
fail: the agents know only their site files. Used by the tests
(``tests/test_site_agent.py``) and ``bench/counter_sources.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import yaml

from netns_testbed.topo import namespace

REPO = Path(__file__).resolve().parent.parent


def flowpulse_argv(*args: str, netns: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "flowpulse", *args]
    return ["ip", "netns", "exec", netns, *argv] if netns else argv


class SiteAgents:
    """``with SiteAgents(tb, out, counters="ebpf") as agents: ...``; after the block, ``alerts()`` and
    ``incidents()`` hold what every agent wrote, and ``exit_codes`` how each one ended (SIGTERM)."""

    def __init__(self, tb, out: Path, counters: str = "ebpf", record: bool = False, extra: tuple[str, ...] = (),
                 edit_site: "Callable[[str, dict], dict] | None" = None, shared_verdicts: bool = True,
                 command: "Callable[[list[str], str], list[str]] | None" = None, cwd: Path = REPO) -> None:
        """``edit_site(switch, data)``: each site file's content, changed before its agent starts (peers,
        keys); ``shared_verdicts`` False: each agent its own verdict directory (they share nothing);
        ``command(args, netns)``: the argv that runs ``flowpulse *args`` in that namespace (default: this
        checkout's, :func:`flowpulse_argv`), started in ``cwd``."""
        self.tb, self.out, self.counters, self.record, self.extra = tb, out, counters, record, extra
        self.edit_site, self.shared_verdicts = edit_site, shared_verdicts
        self.command = command or (lambda args, netns: flowpulse_argv(*args, netns=netns))
        self.cwd = cwd
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_codes: dict[str, int] = {}
        self.empty_run = out / "no-testbed-here"

    def _export(self) -> Path:
        sites = self.out / "sites"
        sites.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(flowpulse_argv("fabric", "export-site", "--prefix", self.tb.prefix, "--all", "--dir",
                                          str(sites), "--counters", self.counters), cwd=REPO,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"export-site failed: {r.stderr.strip()}")
        return sites

    def log(self, switch: str) -> Path:
        return self.out / f"agent-{switch}.log"

    def __enter__(self) -> "SiteAgents":
        sites = self._export()
        self.empty_run.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FLOWPULSE_RUN_DIR": str(self.empty_run)}   # any read of testbed state fails
        try:
            for sw in self.tb.fabric.switches:
                if self.edit_site is not None:
                    path = sites / f"{sw}.yaml"
                    path.write_text(yaml.safe_dump(self.edit_site(sw, yaml.safe_load(path.read_text()))))
                verdicts = self.out / ("verdicts" if self.shared_verdicts else f"verdicts-{sw}")
                args = ["agent", "--site", str(sites / f"{sw}.yaml"), "--state-dir", str(self.out / "state" / sw),
                        "--verdict-dir", str(verdicts), "--alerts", str(self.out / f"alerts-{sw}.jsonl"),
                        "--incidents", str(self.out / f"incidents-{sw}.jsonl"), *self.extra]
                if self.record:
                    args += ["--record", str(self.out / "pulses")]
                with open(self.log(sw), "w") as log:
                    self.procs[sw] = subprocess.Popen(self.command(args, namespace(self.tb.prefix, sw)),
                                                      cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
            for sw in self.tb.fabric.switches:
                self._wait_ready(sw, 120)
        except BaseException:
            self._kill()
            raise
        return self

    def _wait_ready(self, switch: str, timeout: float) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if "flowpulse.agent: watching" in self.log(switch).read_text():
                return
            if self.procs[switch].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the agent of {switch} did not start: {self.log(switch).read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for sw, p in self.procs.items():
            try:
                self.exit_codes[sw] = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                self.exit_codes[sw] = p.wait()

    def _kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    def _lines(self, kind: str) -> list[dict]:
        out = []
        for sw in self.tb.fabric.switches:
            path = self.out / f"{kind}-{sw}.jsonl"
            if path.exists():
                out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return out

    def alerts(self) -> list[dict]:
        """Every alert event ("alert", "update", "resolved") of every switch's agent."""
        return self._lines("alerts")

    def incidents(self) -> list[dict]:
        return self._lines("incidents")
