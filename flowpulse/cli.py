"""``flowpulse``: the command line. One module per verb (flowpulse/cmd_*.py).

Exit codes: :class:`flowpulse.errors.ExitCode` (docs/reference/exit-codes.md is generated from it).
Logs and progress go to stderr; results to stdout (``--json`` for machines).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys

from flowpulse import (__version__, cmd_agent, cmd_counters, cmd_experiment, cmd_fabric, cmd_fault, cmd_feed,
                       cmd_hook, cmd_sweep, cmd_workload)
from flowpulse.cmdbase import Formatter, JsonLogFormatter, Parser
from flowpulse.errors import SIGNAL_BASE, ExitCode, UserError


def build_parser() -> argparse.ArgumentParser:
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


@contextlib.contextmanager
def unwinding_signals():
    """SIGTERM and SIGHUP unwind the calling process like Ctrl-C (:class:`Terminated`) while inside, so
    its clean-up runs; the caller's handlers come back at the end. The CLI and the benches use it."""
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    saved = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    # the agent installs its own (a clean stop, exit 143)
    with unwinding_signals():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The project's own loggers (all under "flowpulse") at INFO; other libraries' only from WARNING
    # (matplotlib's first import on a fresh machine logs its font cache at INFO, which broke the
    # one-line error of bad input); -v: the project's at DEBUG; -vv: everything at DEBUG.
    verbose = getattr(args, "verbose", 0)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("flowpulse").setLevel(logging.DEBUG if verbose else logging.INFO)
    if getattr(args, "log_json", False):
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())
    if verbose >= 2:
        logging.getLogger().setLevel(logging.DEBUG)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"flowpulse: error: {e}", file=sys.stderr)
        return e.code
    except Terminated as e:
        print(f"flowpulse: stopped by signal {e.signum}, cleaned up", file=sys.stderr)
        return SIGNAL_BASE + e.signum
    except KeyboardInterrupt:
        print("flowpulse: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
