#!/usr/bin/env python3
"""The kernel-facing tests on each distribution kernel, in the emulated guest, one table at the end.

Runs ``scripts/guest-test.sh --kernel K -- SELECTION`` for every kernel and prints, per kernel: the hook
its programs attach with (tcx from 6.6, else tc clsact), pytest's passed / failed / skipped, and the
minutes it took (set-up, download on a first run, boot and pytest). Too long for CI (the guest is
emulated: no KVM here); CI's test command keeps its 6.1 pass. While a guest runs, its runner's progress
comes on stderr: how far pytest got every five minutes, and a failing test at once.

  sudo .venv/bin/python bench/kernel_matrix.py                       # 6.1 and 6.12, the default selection
  sudo .venv/bin/python bench/kernel_matrix.py --kernel 6.12.107+deb12-amd64 -- tests/test_datapath_unit.py
  sudo .venv/bin/python bench/kernel_matrix.py --json > matrix.json
  sudo .venv/bin/python bench/kernel_matrix.py --keep /tmp/matrix-logs      # each guest's logs, failures named
  sudo .venv/bin/python bench/kernel_matrix.py --resume ~/matrix --timeout-min 90   # as far as 90 min a kernel goes
  sudo .venv/bin/python bench/kernel_matrix.py --resume ~/matrix --dry-run          # what is left, the table so far
  sudo .venv/bin/python bench/kernel_matrix.py --probe --keep /tmp/m -- tests/test_site_agent.py   # what ran beside

With ``--resume DIR`` the selection can be run over several sittings: each test's outcome on each kernel is
recorded in DIR (guest/ledger.py: per test, with the commit it ran) as the guest finishes it, and the next
run with the same DIR runs only the tests with no record for this code, or whose last one failed. A
record holds while no file the selection runs has changed between its commit and HEAD (a commit to the
docs, to the matrix or to another test file keeps it; a change to the code starts afresh), and
uncommitted code changes are refused. Stopping it (Ctrl-C, SIGTERM, --timeout-min) loses only the test
that was running. The table counts every test of the selection from the records: passed, failed,
skipped, errors, not yet run, the pytest minutes they took, the guest runs they came from and their
minutes, and which tests passed only on a second try. The tests are found on this machine
(``pytest --collect-only``) and given to the guest by node id; each guest's logs are kept in
``DIR/<kernel>/<run>/``.

The default selection is every root test whose outcome the kernel can change: the datapath's programs
and maps (unit tests, the libbpf layer, the C contract), fabric build and teardown with the counters
against the kernel's statistics, every fault kind with the BPF injector and with netem, the agents live
and asleep between pulses, the site agent, and real jobs caught and named. Each kernel's image and
headers are downloaded and unpacked into the guest's cache (BCC compiles against them in the guest);
nothing is installed on this machine.

Each guest gets ``--mem`` MiB (default 6144; the test command's own guest pass keeps guest-test.sh's
3072): the real-job tests run 8 ranks, and a DDP rank of the 8 MiB job peaks at about 540 MiB (a 4 MiB
allreduce rank at about 230), which 3 GiB could not hold: the kernel killed a rank (``exit -9``; the
guest's log now names what the kernel killed, and ``--keep`` keeps its dmesg).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from guest import ledger  # noqa: E402
from guest.kernel import check_version  # noqa: E402
from netns_testbed.errors import EnvironmentProblem, SpecError, UserError  # noqa: E402

KERNELS = ["6.1.0-57-amd64", "6.12.107+deb12-amd64"]
SELECTION = ["tests/test_datapath_unit.py", "tests/test_bpfmaps.py", "tests/test_libbpf_abi.py", "tests/test_contract.py",
             "tests/test_counting_object.py",
             "tests/test_fabric.py", "tests/test_silent_faults.py", "tests/test_netem.py", "tests/test_agent_live.py",
             "tests/test_wakeups.py", "tests/test_site_agent.py", "tests/test_localize_live.py"]
GUEST_MEM_MIB = 6144     # 8 DDP ranks of the 8 MiB job (see the module's text)
SUMMARY = re.compile(r"^guest (\S+): (.*) in [0-9.]+s")


def hook_of(version: str) -> str:
    major, minor = (int(x) for x in version.split(".")[:2])
    return "tcx" if (major, minor) >= (6, 6) else "tc clsact"


def counts(summary: str) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", summary):
        out["errors" if what.startswith("error") else what] += int(n)
    return out


def failures(pytest_log: str) -> list[str]:
    """The tests pytest's short summary names as failed or in error (-rfE)."""
    return [line.split(" - ")[0].split(" ", 1)[1] for line in pytest_log.splitlines()
            if line.startswith(("FAILED ", "ERROR "))]


PROBE = ["-p", "bench.guest_probe"]      # --probe: after each test, what it left running and what used the CPU


def runner_argv(version: str, timeout_s: int, mem_mib: int, kept: Path | None, pytest_args: list[str]) -> list[str]:
    """The guest runner's command line: its own limit a minute inside ours, its logs kept in ``kept``."""
    return [str(ROOT / "scripts" / "guest-test.sh"), "--kernel", version, "--timeout", str(max(30, timeout_s - 60)),
            "--mem", str(mem_mib), *(["--keep", str(kept)] if kept else []), "--", "--timeout=900", "-rfEs",
            *pytest_args]


def run(version: str, selection: list[str], timeout_s: int, keep: Path | None = None, mem_mib: int = GUEST_MEM_MIB) -> dict:
    t0 = time.monotonic()
    kept = (keep / version) if keep is not None else None
    # The guest's own limit (guest-test.sh --timeout, 30 min unless told) is this run's: the whole selection
    # takes hours emulated, and a guest killed at 30 min reported nothing past that.
    argv = runner_argv(version, timeout_s, mem_mib, kept, selection)
    print(f"kernel_matrix: {version}: {' '.join(selection)}", file=sys.stderr, flush=True)
    rc, text = guest(argv, timeout_s, f"kernel_matrix: {version}: ")
    summary = next((m.group(2) for line in text.splitlines() if (m := SUMMARY.match(line))), "")
    row = {"kernel": version, "hook": hook_of(version), "rc": rc, "minutes": round((time.monotonic() - t0) / 60, 1),
           **counts(summary), "summary": summary or (text.strip().splitlines() or ["no output"])[-1]}
    if kept is not None and (kept / "pytest.log").exists():
        row["failed_tests"] = failures((kept / "pytest.log").read_text(errors="replace"))
    print(f"kernel_matrix: {version}: {row['summary']} ({row['minutes']} min)", file=sys.stderr, flush=True)
    for name in row.get("failed_tests", []):
        print(f"kernel_matrix: {version}: failed: {name}", file=sys.stderr, flush=True)
    for line in text.splitlines():           # processes the guest's kernel killed (an OOM kill)
        if line.startswith("guest: kernel: "):
            print(f"kernel_matrix: {version}: {line[len('guest: '):]}", file=sys.stderr, flush=True)
    return row


def brief(line: str, most: int = 6) -> str:
    """The runner's boot line with its pytest arguments cut to ``most`` words (--resume gives it every node id,
    and a node id may hold spaces: the line counts the words left out)."""
    head, sep, rest = line.partition(", pytest ")
    words = rest.split()
    if not sep or len(words) <= most:
        return line
    return f"{head}{sep}{' '.join(words[:most])} ... ({len(words) - most} more words)\n"


_starting = False            # a runner is being started: a stop now waits (see stop)
_pending: int | None = None  # the exit status of a stop that waited


def stop(signum: int, frame) -> None:
    """SIGTERM and Ctrl-C: unwind (exit 128 + the signal) so that :func:`guest` stops its runner, which kills
    its guest and keeps its logs. While a runner is being started the stop waits until :func:`guest` holds
    it: raised inside ``Popen`` (the runner already running) or before the ``try`` that stops it, it left
    the runner and its qemu running after the matrix had gone (tests/test_guest.py)."""
    global _pending
    if _starting:
        _pending = 128 + signum
    else:
        sys.exit(128 + signum)


def guest(argv: list[str], timeout_s: float, prefix: str, popen=subprocess.Popen) -> tuple[int, str]:
    """Run the guest runner; its progress lines (``guest: ...`` on stderr: boot, how far pytest got every few
    minutes, a failure at once) are passed on as they come, after ``prefix``. Returns its exit status (124
    when it ran past ``timeout_s``) and everything it printed."""
    global _starting, _pending
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def pump(stream, name: str) -> None:
        for line in stream:
            chunks[name].append(line)
            if name == "err" and line.startswith("guest: ") and not line.startswith("guest: kernel: "):
                sys.stderr.write(prefix + brief(line[len("guest: "):]))
                sys.stderr.flush()

    _starting = True
    try:
        proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except BaseException:
        _starting = False
        raise
    try:
        _starting = False            # from here a stop unwinds through the finally below
        if _pending is not None:     # stopped while the runner was being started
            code, _pending = _pending, None
            sys.exit(code)
        pumps = [threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
                 threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True)]
        for t in pumps:
            t.start()
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()             # the runner kills its guest and keeps its logs so far (--keep)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()              # the runner's guest dies with it (PR_SET_PDEATHSIG)
            proc.wait()
        rc = 124
    finally:
        if proc.poll() is None:      # the matrix was stopped (SIGTERM, Ctrl-C): so is the runner, which
            proc.terminate()         # kills its guest and keeps the logs so far (--keep)
            proc.wait()
    for t in pumps:
        t.join(timeout=10)
    return rc, "".join(chunks["out"]) + "".join(chunks["err"])


def table(rows: list[dict]) -> str:
    head = f"{'kernel':24} {'hook':10} {'passed':>6} {'failed':>6} {'skipped':>7} {'errors':>6} {'minutes':>7}"
    lines = [head] + [f"{r['kernel']:24} {r['hook']:10} {r['passed']:>6} {r['failed']:>6} {r['skipped']:>7} "
                      f"{r['errors']:>6} {r['minutes']:>7}" for r in rows]
    return "\n".join(lines)


def collect(selection: list[str]) -> list[str]:
    """The node ids of a pytest selection, found on this machine (``pytest --collect-only -q``)."""
    py = ROOT / ".venv" / "bin" / "python"
    out = subprocess.run([str(py if py.exists() else sys.executable), "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *selection], cwd=ROOT, capture_output=True, text=True)
    head = out.stdout.split("\n\n", 1)[0]      # the ids, then a blank line, warnings and the count
    ids = [line for line in head.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode != 0 or not ids:
        said = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
        raise SpecError(f"pytest found no tests in {' '.join(selection)} ({said[-1] if said else 'no output'}): "
                        "give test files or node ids of this checkout")
    return ids


def run_resumed(version: str, ids: list[str], timeout_s: int, book: ledger.Ledger, valid: set[str], commit: str,
                mem_mib: int = GUEST_MEM_MIB, extra: list[str] | None = None) -> ledger.Run:
    """Run on ``version`` the tests of ``ids`` that the records in ``book`` from the ``valid`` commits do not
    have yet, and record each one the guest finishes, also when this run is stopped or runs out of time."""
    left = ledger.todo(ids, book.current(version, valid))
    run_id = f"{version}@{time.strftime('%Y%m%dT%H%M%S')}"
    kept = book.dir / version / run_id.split("@")[1]
    argv = runner_argv(version, timeout_s, mem_mib, kept, [*(extra or []), *left])
    print(f"kernel_matrix: {version}: {len(left)} of {len(ids)} tests to run (the records in {book.dir} have the rest "
          f"for this code)", file=sys.stderr, flush=True)
    t0, rc = time.monotonic(), None
    try:
        rc, _ = guest(argv, timeout_s, f"kernel_matrix: {version}: ")
    finally:                # also when stopped: what the guest finished is recorded
        log = (kept / "report.jsonl").read_text(errors="replace") if (kept / "report.jsonl").exists() else ""
        recs = ledger.new_records(version, log, commit, run_id, left)
        done = ledger.Run(version, run_id, commit, len(left), len(recs), rc, round((time.monotonic() - t0) / 60, 1))
        book.add(recs, done)
        print(f"kernel_matrix: {version}: recorded {len(recs)} of {len(left)} tests ({done.minutes} min)",
              file=sys.stderr, flush=True)
    return done


def resumed_row(version: str, ids: list[str], book: ledger.Ledger, valid: set[str]) -> dict:
    """One kernel's row from the records: every test of the selection counted by its latest valid outcome,
    or as not run."""
    cur = book.current(version, valid)
    have = [cur[t] for t in ids if t in cur]
    n = {o: sum(r.outcome == o for r in have) for o in ledger.OUTCOMES}
    runs = {r.run for r in have}
    guest_min = sum(r.minutes for r in book.runs() if r.run in runs)
    return {"kernel": version, "hook": hook_of(version), "passed": n["passed"], "failed": n["failed"],
            "skipped": n["skipped"], "errors": n["error"], "not_run": len(ids) - len(have),
            "minutes": round(sum(r.seconds for r in have) / 60, 1), "guest_minutes": round(guest_min, 1),
            "runs": len(runs), "commits": sorted({r.commit[:10] for r in have}),
            "failed_tests": [r.test for r in have if r.outcome in ("failed", "error")],
            "second_try": [t for t in book.failed_then_passed(version, valid) if t in set(ids)]}


def resumed_table(rows: list[dict], head: str) -> str:
    top = (f"{'kernel':24} {'hook':10} {'passed':>6} {'failed':>6} {'skipped':>7} {'errors':>6} {'not run':>7} "
           f"{'minutes':>7} {'guest min':>9} {'runs':>4}")
    lines = [top]
    for r in rows:
        lines.append(f"{r['kernel']:24} {r['hook']:10} {r['passed']:>6} {r['failed']:>6} {r['skipped']:>7} "
                     f"{r['errors']:>6} {r['not_run']:>7} {r['minutes']:>7} {r['guest_minutes']:>9} {r['runs']:>4}")
    for r in rows:
        lines += [f"{r['kernel']}: failed: {t}" for t in r["failed_tests"]]
        lines += [f"{r['kernel']}: passed on a second try: {t}" for t in r["second_try"]]
    commits = sorted({c for r in rows for c in r["commits"]})
    lines.append(f"the code of {head[:10]}; records from {', '.join(commits) or 'no commit yet'}; minutes: the tests' "
                 "own (pytest), guest min: the runs they came from, set-up and boot included")
    return "\n".join(lines)


def resume(args: argparse.Namespace, kernels: list[str]) -> int:
    ledger.Ledger.check(args.resume)
    ids = collect(args.tests or SELECTION)
    files = ledger.test_files(ids)
    commit = ledger.head(ROOT, files)
    if not args.dry_run and os.geteuid() != 0:
        raise EnvironmentProblem("the guest runs its tests as root over the host's root filesystem: run with sudo")
    book = ledger.Ledger(args.resume)
    valid = book.valid(ROOT, files) | {commit}
    if book.unreadable:
        print(f"kernel_matrix: {book.unreadable} lines of {book.records_path} are not records: passed over",
              file=sys.stderr)
    failed_runs = 0
    for k in kernels:
        if args.dry_run:
            print(f"kernel_matrix: {k}: {len(ledger.todo(ids, book.current(k, valid)))} of {len(ids)} tests "
                  "left to run for this code", file=sys.stderr)
        elif ledger.todo(ids, book.current(k, valid)):
            done = run_resumed(k, ids, args.timeout_min * 60, book, valid, commit, args.mem, PROBE if args.probe else [])
            failed_runs += done.rc not in (0, 1)       # 1: a test failed, which the row says
    rows = [resumed_row(k, ids, book, valid) for k in kernels]
    print(json.dumps(rows, indent=2) if args.json else resumed_table(rows, commit))
    complete = all(r["failed"] == r["errors"] == r["not_run"] == 0 for r in rows)
    return 0 if complete and not failed_runs else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", help="a Debian kernel version (repeatable; default: 6.1 and 6.12)")
    ap.add_argument("--timeout-min", type=int, default=240, help="per kernel, minutes")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    ap.add_argument("--keep", type=Path, help="keep each guest's logs in DIR/<kernel>/ and name the failed tests")
    ap.add_argument("--resume", type=Path, metavar="DIR",
                    help="record each test's outcome in DIR and run only what DIR has no record of at this code")
    ap.add_argument("--dry-run", action="store_true", help="with --resume: say what is left and print the table so far")
    ap.add_argument("--probe", action="store_true", help="after each test, say in pytest's log what it left running "
                    "and what used the CPU (bench/guest_probe.py)")
    ap.add_argument("--mem", type=int, default=GUEST_MEM_MIB,
                    help=f"guest memory in MiB (default {GUEST_MEM_MIB}: 8 DDP ranks)")
    ap.add_argument("tests", nargs="*", help="pytest selection (default: the kernel-facing root tests)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, stop)      # unwinds run(), which stops its guest
    signal.signal(signal.SIGINT, stop)
    try:
        kernels = [check_version(k) for k in (args.kernel or KERNELS)]
        if not 1 <= args.timeout_min <= 1440 or not 1024 <= args.mem <= 65536:
            raise SpecError("bad --timeout-min/--mem: 1-1440 minutes, 1024-65536 MiB")
        if args.dry_run and args.resume is None:
            raise SpecError("--dry-run reads the records of --resume DIR: give --resume DIR")
        if args.resume is not None and args.keep is not None:
            raise SpecError("--resume DIR keeps every guest's logs in DIR/<kernel>/: leave out --keep")
        if args.resume is not None:
            return resume(args, kernels)
    except UserError as e:          # one line; 2 bad input, 3 the environment
        print(f"kernel_matrix: {e}", file=sys.stderr)
        return int(e.code)
    extra = PROBE if args.probe else []
    rows = [run(k, [*extra, *(args.tests or SELECTION)], args.timeout_min * 60, args.keep, args.mem) for k in kernels]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
