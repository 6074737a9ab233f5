"""``python -m guest``: the project's tests on a distribution's stock kernel (scripts/guest-test.sh runs this)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem, SpecError

DEFAULT_TESTS = ["--timeout=900", "tests/test_netem.py"]
EPILOG = """examples:
  sudo scripts/guest-test.sh                                   # tests/test_netem.py on Debian's 6.1 kernel
  sudo scripts/guest-test.sh -- tests/test_netem.py -k drop    # a chosen set (pytest arguments after --)
  sudo scripts/guest-test.sh --kernel 6.1.0-57-amd64 --keep /tmp/guest-logs --json
exit status: pytest's (0 passed, 1 failed, ...); 2 bad input; 3 the guest could not run (what is missing).
"""


def cache_dir() -> Path:
    env = os.environ.get("FLOWPULSE_GUEST_CACHE")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowpulse" / "guest"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/guest-test.sh", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", help="Debian kernel version, e.g. 6.1.0-57-amd64 (default: the one whose headers "
                                    "scripts/setup.sh installed for BCC)")
    p.add_argument("--cpus", type=int, default=2, help="guest CPUs (emulated; default 2)")
    p.add_argument("--mem", type=int, default=3072, help="guest memory in MiB (default 3072)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the guest is killed (default 1800)")
    p.add_argument("--keep", type=Path, help="copy the guest's pytest, run and console logs to this directory "
                   "(and, when pytest failed, its test directories: pytest-tmp/)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST ARGS", help=f"default: {' '.join(DEFAULT_TESTS)}")
    args = p.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    from guest import kernel, vm

    try:
        if not 1 <= args.cpus <= 64 or not 1024 <= args.mem <= 65536 or not 30 <= args.timeout <= 86400:
            raise SpecError("bad --cpus/--mem/--timeout: 1-64 CPUs, 1024-65536 MiB, 30-86400 s")
        if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
            raise SpecError(f"--keep {args.keep} is not a directory: give a new or existing directory")
        if os.geteuid() != 0:
            raise EnvironmentProblem("the guest runs its tests as root over the host's root filesystem: run with sudo")
        version = kernel.check_version(args.kernel) if args.kernel else kernel.default_version()
        tree = kernel.fetch(version, cache_dir(), log)
        res = vm.run(tree, args.pytest_args or DEFAULT_TESTS, args.cpus, args.mem, args.timeout, args.keep, log)
    except SpecError as e:
        print(f"guest-test: {e}", file=sys.stderr)
        return 2
    except EnvironmentProblem as e:
        print(f"guest-test: {e}", file=sys.stderr)
        return 3
    except vm.Stopped:
        print("guest-test: stopped (SIGTERM); the guest was killed", file=sys.stderr)
        return 143
    for line in res.guest_log.splitlines():     # processes the kernel killed (an OOM kill): always said
        if line.startswith("guest: kernel: "):
            print(line, file=sys.stderr)
    if args.json:
        print(json.dumps({"kernel": version, "rc": res.rc, "summary": res.summary, "seconds": round(res.seconds, 1)}))
    else:
        if res.rc not in (0, None):
            sys.stderr.write(res.pytest_log[-6000:])
        print(f"guest {version}: {res.summary} ({res.seconds:.0f} s in the guest)")
    if res.rc is None:
        sys.stderr.write(res.guest_log[-3000:] or res.console[-3000:])
        return 3
    return res.rc


if __name__ == "__main__":
    sys.exit(main())
