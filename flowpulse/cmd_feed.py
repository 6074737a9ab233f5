"""``flowpulse feed``: the detectors and the incident tracker over per-pulse counts read as JSON lines
(counters this project does not read itself; format in agent/feed.py and docs/reference/feed.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flowpulse.cmdbase import Formatter, add_common
from flowpulse.cmd_agent import add_detector_args, check_output_file, detector_config
from flowpulse.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "feed", help="run the detectors on per-pulse counts read as JSON lines (file or stdin)",
        formatter_class=Formatter,
        description="Reads a feed: a header line with the fabric, then one switch-pulse of port counts per line "
                    "in the order the pulses ended. Prints alert and incident events as they happen "
                    "(JSON lines with --json). No root, no testbed: counters can come from anywhere.",
        epilog="examples:\n  flowpulse replay tests/data/recorded-runs/busy-ddp-two-faults --as-feed > ddp.feed\n"
               "  flowpulse feed ddp.feed\n"
               "  my-asic-exporter | flowpulse feed - --json --incidents incidents.jsonl\n")
    p.add_argument("source", help="feed file, or - for stdin")
    p.add_argument("--alerts", type=Path, help="append alert events to this JSON-lines file")
    p.add_argument("--incidents", type=Path, help="append incident events to this JSON-lines file")
    add_detector_args(p)
    add_common(p, prefix=False)
    p.set_defaults(func=cmd_feed)


def cmd_feed(args: argparse.Namespace) -> int:
    from agent.feed import Judge, read_feed

    cfg = detector_config(args)
    for flag, path in (("--alerts", args.alerts), ("--incidents", args.incidents)):
        check_output_file(flag, path)
    if args.source != "-" and not Path(args.source).is_file():
        raise SpecError(f"feed {args.source}: no such file; give a feed file or - for stdin")
    stream = sys.stdin if args.source == "-" else open(args.source, encoding="utf-8")
    try:
        header, pulses = read_feed(stream)
        judge = Judge(header.fabric, cfg, header.spray, list(header.out_of_service),
                      header.fabric.parse_link_list(args.degraded), changes=list(header.changes))
        files = {k: (open(p, "a", encoding="utf-8") if p else None)
                 for k, p in (("alert", args.alerts), ("incident", args.incidents))}
        counts = {"alert": 0, "incident": 0}
        try:
            for pc in pulses:
                alerts, incidents = judge.observe(pc)
                for kind, events in (("alert", alerts), ("incident", incidents)):
                    for e in events:
                        counts[kind] += e["event"] in ("alert", "open")
                        if files[kind]:
                            files[kind].write(json.dumps(e) + "\n")
                        if args.json:
                            print(json.dumps({"type": kind, **e}), flush=True)
                        elif e["event"] != "update":
                            print(_human(kind, e), flush=True)
        finally:
            for f in files.values():
                if f:
                    f.close()
    finally:
        if stream is not sys.stdin:
            stream.close()
    print(f"flowpulse: feed: {judge.pulses} switch-pulses, {counts['alert']} alert(s), "
          f"{counts['incident']} incident(s)", file=sys.stderr)
    return 0


def _human(kind: str, e: dict) -> str:
    if kind == "alert":
        return (f"alert {e['event']:8} {e['switch']} port {e['port']} ({e['ifname']}) {e['kind']} "
                f"~{e['estimated_rate']:.2%} link={e['link'] or ' / '.join(e['candidates'])}")
    return f"incident {e['event']:9} {e['incident_id']}: {e['state']} ({e['how']})"
