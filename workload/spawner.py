"""One interpreter imports torch once and forks every rank of a job into its host namespace.

    python -m workload.spawner JOB_DIR < ranks.json      (started by workload.launcher)

A rank started as its own ``ip netns exec ... python -m workload.rank`` pays the
interpreter start and ``import torch`` (2.2-2.5 CPU-seconds each here); eight ranks
on two cores waited about 12 s for that before their first packet. The spawner
pays it once: it reads the job (JSON on stdin), imports torch, then per rank forks a
child that starts its own session, enters the host's network namespace (setns(2) on
``/var/run/netns/<name>``; the child has one thread, so the whole process moves),
takes its environment, sends its output to its log file and runs
:func:`workload.rank.main`.

It reports on stdout, one JSON object a line: ``{"rank": r, "pid": p}`` when a rank
is forked, ``{"rank": r, "exit": code}`` when it ends (negative: killed by that
signal, as ``subprocess`` reports it). It exits when every rank has ended. On
SIGTERM (the launcher's failure, deadline or Ctrl-C path) it SIGKILLs every rank's
session, then exits. If the launcher itself is SIGKILLed, the ranks live on in the
fabric's namespaces, where ``fabric down`` finds and kills them (as before).
torch's import leaves no thread that a forked child needs (gloo and the intra-op
pool start in the child); ``OMP_NUM_THREADS`` comes from the launcher's environment
before the import.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback


def _name(comm: str) -> None:
    """The rank's name in ps/top (prctl PR_SET_NAME; the command line stays the spawner's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, comm.encode()[:15], 0, 0, 0)


def _child(job: dict) -> int:
    from netns_testbed.nsutil import enter_netns
    from workload import rank

    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    _name(f"fp-rank{job['rank']}")
    os.setsid()
    enter_netns(job["netns"])      # a failure here is in the rank's log
    os.environ.clear()
    os.environ.update(job["env"])
    return rank.main(job["argv"])


def main() -> int:
    # argv[1]: the job's directory, there only for `ps` (every rank's command line is this one)
    ranks = json.loads(sys.stdin.readline())
    import torch  # noqa: F401  (the point: once, before the forks)
    import torch.distributed  # noqa: F401
    from workload import rank  # noqa: F401

    out = sys.stdout
    pids: dict[int, int] = {}

    def stop(signum, frame) -> None:
        """SIGTERM from the launcher (failure, deadline, Ctrl-C): every rank forked so far goes too."""
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for job in ranks:
        out.flush()
        # SIGTERM waits while a rank is forked and recorded, so that stop() knows every rank
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                os.close(0)
                code = _child(job)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        pids[pid] = job["rank"]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        out.write(json.dumps({"rank": job["rank"], "pid": pid}) + "\n")
        out.flush()
    while pids:
        pid, status = os.wait()
        if pid in pids:
            out.write(json.dumps({"rank": pids.pop(pid), "exit": os.waitstatus_to_exitcode(status)}) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
