"""What every ``flowpulse`` command shares: the help formatter, the common flags (--prefix, --json,
-v, --log-json), the parser that refuses in one line, and the output helpers. The commands
(flowpulse/cmd_*.py) import this; flowpulse/cli.py imports the commands: one way up, no circle."""
from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any, Callable

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
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="more log detail on stderr: -v this tool's debug logs, -vv every library's too")
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
