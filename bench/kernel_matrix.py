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
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def run(version: str, selection: list[str], timeout_s: int, keep: Path | None = None, mem_mib: int = GUEST_MEM_MIB) -> dict:
    t0 = time.monotonic()
    kept = (keep / version) if keep is not None else None
    # The guest's own limit (guest-test.sh --timeout, 30 min unless told) is this run's: the whole selection
    # takes hours emulated, and a guest killed at 30 min reported nothing past that.
    argv = [str(ROOT / "scripts" / "guest-test.sh"), "--kernel", version, "--timeout", str(max(30, timeout_s - 60)),
            "--mem", str(mem_mib),
            *(["--keep", str(kept)] if kept else []),
            "--", "--timeout=900", "-rfEs", *selection]
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


def guest(argv: list[str], timeout_s: float, prefix: str) -> tuple[int, str]:
    """Run the guest runner; its progress lines (``guest: ...`` on stderr: boot, how far pytest got every few
    minutes, a failure at once) are passed on as they come, after ``prefix``. Returns its exit status (124
    when it ran past ``timeout_s``) and everything it printed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def pump(stream, name: str) -> None:
        for line in stream:
            chunks[name].append(line)
            if name == "err" and line.startswith("guest: ") and not line.startswith("guest: kernel: "):
                sys.stderr.write(prefix + line[len("guest: "):])
                sys.stderr.flush()

    pumps = [threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True)]
    for t in pumps:
        t.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()                  # the runner's guest dies with it (PR_SET_PDEATHSIG)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", help="a Debian kernel version (repeatable; default: 6.1 and 6.12)")
    ap.add_argument("--timeout-min", type=int, default=240, help="per kernel, minutes")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    ap.add_argument("--keep", type=Path, help="keep each guest's logs in DIR/<kernel>/ and name the failed tests")
    ap.add_argument("--mem", type=int, default=GUEST_MEM_MIB,
                    help=f"guest memory in MiB (default {GUEST_MEM_MIB}: 8 DDP ranks)")
    ap.add_argument("tests", nargs="*", help="pytest selection (default: the kernel-facing root tests)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # unwinds run(), which stops its guest
    rows = [run(k, args.tests or SELECTION, args.timeout_min * 60, args.keep, args.mem) for k in (args.kernel or KERNELS)]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
