"""Launch a torch.distributed (gloo) job with one rank per host namespace.

The ranks are forked by one interpreter that imported torch once
(:mod:`workload.spawner`), each into its own session and host namespace. The
launcher owns them: on Ctrl-C, a rank failure or the wall-clock deadline every
rank is killed and the failing rank is named. ``GLOO_SOCKET_IFNAME=eth0`` is set (without it gloo
resolves the hostname to 127.0.0.1 and ranks hang).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from netns_testbed.errors import EnvironmentProblem, SpecError
from netns_testbed.topo import Fabric
from netns_testbed.nsutil import kill_pids
from netns_testbed.slowdown import slowdown
from netns_testbed.state import Testbed
from enum import Enum

from workload.rank import WORKLOADS

log = logging.getLogger("flowpulse.workload")
class Placement(str, Enum):
    """Where rank r runs: interleaved (rank r on leaf r mod L: every leaf-spine link carries the ring)
    or contiguous (ranks fill a leaf's hosts first)."""

    INTERLEAVED = "interleaved"
    CONTIGUOUS = "contiguous"

    def __str__(self) -> str:
        return self.value


PLACEMENTS = tuple(p.value for p in Placement)


def parse_size(text: str | int) -> int:
    """Sizes like 4MiB, 512KiB, 1GiB or plain bytes (a whole number of bytes, finite)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    t = str(text).strip()
    for suffix, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("G", 1 << 30), ("M", 1 << 20),
                         ("K", 1 << 10), ("B", 1)):
        if t.endswith(suffix):
            t, m = t[: -len(suffix)], mult
            break
    else:
        m = 1
    try:
        return int(float(t) * m)
    except (ValueError, OverflowError):      # "x", "nan", "inf"
        raise SpecError(f"bad size {str(text)!r}: use e.g. 4MiB, 512KiB or bytes") from None


@dataclass
class JobSpec:
    """What to run: collective, size, iterations, idle phase, ranks, placement, timeouts."""

    workload: str = "allreduce"
    size: int = 4 << 20
    iterations: int = 20
    idle_ms: float = 300.0
    ranks: int | None = None
    placement: str = "interleaved"
    gloo_timeout_s: float = 30.0
    deadline_s: float | None = None
    seed: int = 0
    port: int = 29500

    def validate(self, fabric: Fabric) -> None:
        """Every check that needs only the fabric's model: run before anything is built."""
        if self.workload not in WORKLOADS:
            raise SpecError(f"unknown workload {self.workload!r}: choose one of {', '.join(WORKLOADS)}")
        if self.placement not in PLACEMENTS:
            raise SpecError(f"unknown placement {self.placement!r}: choose interleaved or contiguous")
        n = self.ranks or len(fabric.hosts)
        if not 2 <= n <= len(fabric.hosts):
            raise SpecError(f"bad rank count {n}: this fabric has {len(fabric.hosts)} hosts (need 2..that)")
        if not 4 <= self.size <= 1 << 31:
            raise SpecError(f"bad size {self.size}: must be 4 bytes .. 2 GiB")
        if not 1 <= self.iterations <= 100_000:
            raise SpecError(f"bad iterations {self.iterations}: must be 1..100000")
        if not 0 <= self.idle_ms <= 60_000:
            raise SpecError(f"bad idle {self.idle_ms} ms: must be 0..60000")
        if self.gloo_timeout_s <= 0:
            raise SpecError("gloo timeout must be > 0 seconds")
        slowdown()   # a bad FLOWPULSE_SLOWDOWN is refused here, before anything is built

    @property
    def deadline(self) -> float:
        """Wall-clock limit: start-up (torch import) + iterations at a pessimistic pace, times the machine's
        slowdown (an emulated guest's; netns_testbed/slowdown.py)."""
        if self.deadline_s:
            return self.deadline_s * slowdown()
        per_iter = self.idle_ms / 1000 + 2.0 + self.size / 5e6
        return (120.0 + self.iterations * per_iter + self.gloo_timeout_s) * slowdown()


def placement(tb: Testbed, n: int, how: str) -> list[str]:
    """Hosts of ranks 0..n-1. Interleaved puts rank r on leaf r % L, so every ring
    edge crosses the spines and every leaf-spine link carries traffic."""
    f = tb.fabric
    if how == "contiguous":
        return f.hosts[:n]
    order = [h for j in range(f.spec.hosts_per_leaf) for leaf in f.leaves for h in [f.leaf_hosts(leaf)[j]]]
    return order[:n]


@dataclass
class JobResult:
    ok: bool
    spec: dict
    hosts: list[str]
    ranks: list[dict] = field(default_factory=list)
    failed_rank: int | None = None
    failure: str | None = None
    wall_s: float = 0.0
    iterations: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def check_torch() -> None:
    """Ranks run on this interpreter: find torch there without importing it (seconds per job)."""
    if importlib.util.find_spec("torch") is None:
        raise EnvironmentProblem("torch with gloo is not importable: pip install torch==2.13.0 (scripts/setup.sh does it)")


def run_job(tb: Testbed, spec: JobSpec, out_dir: Path,
            progress: Callable[[str], None] | None = None) -> JobResult:
    """Run the job to completion (or failure); always leaves no rank behind."""
    spec.validate(tb.fabric)
    check_torch()
    say = progress or log.info
    n = spec.ranks or len(tb.fabric.hosts)
    hosts = placement(tb, n, spec.placement)
    out_dir.mkdir(parents=True, exist_ok=True)
    master = f"{tb.fabric.host_ip(hosts[0])}:{spec.port}"
    ranks: Spawned | None = None
    t0 = time.time()
    failed_rank, failure = None, None
    try:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("LOCAL_WORLD_SIZE", None)  # else newer gloo may use shared memory, not the wire
        jobs = [{"rank": r, "netns": tb.ns(host), "log": str(out_dir / f"rank{r}.log"),
                 "env": {**env, "FLOWPULSE_HOST": host},
                 "argv": ["--rank", str(r), "--world", str(n), "--master", master, "--workload", spec.workload,
                          "--size", str(spec.size), "--iterations", str(spec.iterations), "--idle-ms",
                          str(spec.idle_ms), "--timeout", str(spec.gloo_timeout_s), "--seed", str(spec.seed),
                          "--out", str(out_dir / f"rank{r}.json"),
                          *(["--progress", str(out_dir / "progress.jsonl")] if r == 0 else [])]}
                for r, host in enumerate(hosts)]
        ranks = Spawned(jobs, env, out_dir)
        say(f"started {n} ranks ({spec.workload}, {spec.size / 2**20:g} MiB x {spec.iterations}) on {', '.join(hosts)}")
        deadline = t0 + spec.deadline
        while True:
            codes = ranks.codes()
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed_rank = _first_failure(out_dir, bad)
                failure = _failure_text(out_dir, failed_rank, dict(bad)[failed_rank])
                break
            if all(c == 0 for c in codes):
                break
            if time.time() > deadline:
                stuck = [r for r, c in enumerate(codes) if c is None]
                failed_rank = stuck[0]
                failure = f"deadline of {spec.deadline:.0f} s passed with ranks {stuck} still running"
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        failure = "interrupted"
        raise
    finally:
        if ranks is not None:
            ranks.kill()
    result = JobResult(ok=failure is None, spec=asdict(spec), hosts=hosts, failed_rank=failed_rank,
                       failure=failure, wall_s=time.time() - t0)
    result.ranks = [_read_rank(out_dir, r) for r in range(n)]
    result.iterations, result.summary = summarize(result.ranks, spec, n)
    (out_dir / "workload.json").write_text(json.dumps(result.to_dict(), indent=1))
    if failure:
        say(f"job failed: rank {failed_rank} ({hosts[failed_rank]}): {failure}")
    return result


class Spawned:
    """The ranks of one job, forked into their namespaces by :mod:`workload.spawner`.

    A thread reads the spawner's reports (each rank's pid, then its exit code). A rank the
    spawner never reported as ended while the spawner is gone counts as failed with the
    spawner's exit status (its output is in ``spawner.log``).
    """

    def __init__(self, jobs: list[dict], env: dict, job_dir: Path) -> None:
        self.n = len(jobs)
        self.pids: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self._log = open(job_dir / "spawner.log", "w")
        # the job's directory on the command line, which the ranks inherit: `ps` tells whose they are
        self.proc = subprocess.Popen([sys.executable, "-m", "workload.spawner", str(job_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, text=True,
                                     start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent))
        self.proc.stdin.write(json.dumps(jobs) + "\n")
        self.proc.stdin.close()
        self._reader = threading.Thread(target=self._read, name="spawner-reports", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:          # not a report (the spawner's stdout is only its)
                log.warning("spawner: %s", line.rstrip())
                continue
            if "pid" in msg:
                self.pids[msg["rank"]] = msg["pid"]
            else:
                self.exits[msg["rank"]] = msg["exit"]

    def codes(self) -> list[int | None]:
        """Per rank its exit code, None while it runs."""
        gone = self.proc.poll() is not None and not self._reader.is_alive()
        lost = (self.proc.returncode or 1) if gone else None
        return [self.exits.get(r, lost) for r in range(self.n)]

    def kill(self) -> None:
        """Every rank and the spawner gone: SIGTERM makes the spawner SIGKILL each rank's session;
        the ranks it reported are killed here too, and waited for."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        running = [pid for r, pid in self.pids.items() if r not in self.exits]
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_pids(running)
        self._log.close()


def _read_rank(out_dir: Path, r: int) -> dict:
    try:
        return json.loads((out_dir / f"rank{r}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"rank": r, "ok": False, "error": "no result (killed or crashed)", "iterations": []}


def _first_failure(out_dir: Path, bad: list[tuple[int, int]]) -> int:
    """The rank that failed first by its own report; peers fail as a consequence."""
    reports = [(r, _read_rank(out_dir, r)) for r, _ in bad]
    own = [r for r, rep in reports if rep.get("error") and "Connection closed by peer" not in rep["error"]]
    return (own or [bad[0][0]])[0]


def _failure_text(out_dir: Path, r: int, code: int) -> str:
    rep = _read_rank(out_dir, r)
    if rep.get("error") and rep["error"] != "no result (killed or crashed)":
        return f"exit {code}: {rep['error']}"
    tail: list[str] = []
    for log_file in (out_dir / f"rank{r}.log", out_dir / "spawner.log"):  # the spawner's if the rank never ran
        if not tail and log_file.exists():
            tail = log_file.read_text(errors="replace").strip().splitlines()[-1:]
    if code < 0:      # the first rank to fail was killed by a signal the launcher had not sent
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        hint = " (the kernel's OOM killer, if dmesg says so)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}: {tail[0] if tail else 'no output'}"
    return f"exit {code}: {tail[0] if tail else 'no output'}"


def summarize(ranks: list[dict], spec: JobSpec, n: int) -> tuple[list[dict], dict]:
    """Per-iteration job view (first start, last end over ranks) and bus bandwidth.

    ``first_tx_payload`` is each rank's TCP payload sent once (tcp_info: sent minus
    retransmitted bytes): spraying reorders packets and TCP retransmits spuriously
    (tens to hundreds of segments per iteration with no loss), which is traffic
    but not the collective's.
    """
    its = []
    count = min((len(r.get("iterations", [])) for r in ranks), default=0)
    for i in range(count):
        rows = [r["iterations"][i] for r in ranks]
        start, end = min(x["start"] for x in rows), max(x["end"] for x in rows)
        its.append({"index": i, "start": start, "end": end, "duration_s": end - start,
                    "mono_start_ns": min(x["mono_start_ns"] for x in rows),
                    "mono_end_ns": max(x["mono_end_ns"] for x in rows),
                    "tx_bytes": [x["tx_bytes"] for x in rows], "rx_bytes": [x["rx_bytes"] for x in rows],
                    "tx_payload": [x["tx_payload"] for x in rows],
                    "retrans_segs": [x["retrans_segs"] for x in rows],
                    "first_tx_payload": [x["first_tx_payload"] for x in rows],
                    "retrans_bytes": [x["retrans_bytes"] for x in rows],
                    **({"loss": sum(x["loss"] for x in rows) / n} if "loss" in rows[0] else {})})
    summary: dict = {"completed_iterations": count}
    if its:
        import statistics

        durs = sorted(x["duration_s"] for x in its)
        med = statistics.median(durs)
        # bus bandwidth convention (nccl-tests): allreduce moves 2(N-1)/N x S per rank
        factor = {"allreduce": 2 * (n - 1) / n, "ddp": 2 * (n - 1) / n}.get(spec.workload, (n - 1) / n)
        summary.update({"iteration_s_median": med, "iteration_s_p95": durs[min(len(durs) - 1, int(0.95 * len(durs)))],
                        "busbw_gbps": spec.size * factor * 8 / med / 1e9 if med > 0 else None,
                        "tx_bytes_per_rank_per_iter": [statistics.mean(x["tx_bytes"][r] for x in its) for r in range(n)],
                        "tx_payload_per_rank_per_iter": [statistics.mean(x["tx_payload"][r] for x in its) for r in range(n)]})
    return its, summary
