"""``flowpulse``: the command line. One module per verb (flowpulse/cmd_*.py).

Exit codes: 0 success; 1 the command ran but found a failure (e.g. unreachable
hosts, a demo fault not caught); 2 bad input; 3 missing privilege, package or
kernel feature; 4 testbed not in the needed state; 130 interrupted.
Logs and progress go to stderr; results to stdout (``--json`` for machines).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any, Callable

from flowpulse import __version__
from flowpulse.errors import UserError

log = logging.getLogger("flowpulse")
DEFAULT_PREFIX = os.environ.get("FLOWPULSE_PREFIX", "fp")


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def add_common(p: argparse.ArgumentParser, prefix: bool = True, json_out: bool = True) -> None:
    if prefix:
        p.add_argument("--prefix", default=DEFAULT_PREFIX,
                       help="testbed name prefix: every namespace and map of the testbed carries it (env FLOWPULSE_PREFIX)")
    if json_out:
        p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log detail on stderr")
    p.add_argument("--log-json", action="store_true", help="logs on stderr as JSON lines (for journald, Loki, ...)")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        text = human(data)
        if text:
            print(text)


def table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """Bad flags are one line on stderr naming the problem (and where the help is), exit 2: argparse's
    own error prints the whole usage block first. Subcommand parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from flowpulse import (cmd_agent, cmd_counters, cmd_experiment, cmd_fabric, cmd_fault, cmd_feed, cmd_hook,
                          cmd_sweep, cmd_workload)

    parser = Parser(
        prog="flowpulse", formatter_class=Formatter,
        description="FlowPulse: catch silent link faults in a sprayed leaf-spine fabric from the temporal "
                    "symmetry of collective traffic.",
        epilog="examples:\n  sudo flowpulse fabric up\n  sudo flowpulse fault add 'leaf1->spine2:drop=0.01'\n"
               "  sudo flowpulse counters --switch leaf2\n  sudo flowpulse fabric down\n")
    parser.add_argument("--version", action="version", version=f"flowpulse {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in (cmd_fabric, cmd_fault, cmd_counters, cmd_workload, cmd_agent, cmd_hook, cmd_feed, cmd_experiment,
                cmd_sweep):
        mod.register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every command's clean-up runs (the testbed an
    experiment built, its ranks, the bpffs mount); the exit status is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _terminate(signum, frame) -> None:
    if os.getpid() != _MAIN_PID:
        # a forked helper (pyroute2 forks one per namespace it creates, and stops it with SIGTERM):
        # die as the signal says; unwinding the copied stack would run the command's clean-up in the
        # child and take the half-built testbed down under the parent
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(signum)


_MAIN_PID = os.getpid()


def main(argv: list[str] | None = None) -> int:
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    # the agent installs its own (a clean stop, exit 143); a caller's handlers come back at the end
    saved = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _main(argv)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose if hasattr(args, "verbose") else 0, 2)
    logging.basicConfig(level=min(level, logging.INFO) if getattr(args, "verbose", 0) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if getattr(args, "log_json", False):
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())
    if getattr(args, "verbose", 0) >= 2:
        logging.getLogger().setLevel(logging.DEBUG)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"flowpulse: error: {e}", file=sys.stderr)
        return e.code
    except Terminated as e:
        print(f"flowpulse: stopped by signal {e.signum}, cleaned up", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("flowpulse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
