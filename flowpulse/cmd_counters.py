"""``flowpulse counters``: the per-port counters of the switches, as a table or JSON."""
from __future__ import annotations

import argparse

from flowpulse.cmdbase import Formatter, add_common, emit, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("counters", help="per-port packet/byte counters of the switches", formatter_class=Formatter,
                       epilog="examples:\n  sudo flowpulse counters\n  sudo flowpulse counters --switch leaf2 --json\n")
    p.add_argument("--switch", action="append", default=[], help="only this switch (repeatable)")
    p.add_argument("--nonzero", action="store_true", help="hide ports that counted nothing")
    add_common(p)
    p.set_defaults(func=cmd_counters)


def cmd_counters(args: argparse.Namespace) -> int:
    from flowpulse.errors import SpecError
    from netns_testbed.counters import port_rows
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed

    require_root()
    tb = Testbed.load(args.prefix)
    for sw in args.switch:
        if sw not in tb.fabric.switches:
            raise SpecError(f"unknown switch {sw!r}: this fabric has {', '.join(tb.fabric.switches)}")
    rows = port_rows(tb, args.switch or None)
    if args.nonzero:
        rows = [r for r in rows if r["pkts"]]
    emit(args, rows, lambda r: table(r, ["switch", "port", "ifname", "dir", "link", "pkts", "bytes",
                                         "tcp_data", "tcp_ctrl", "other_ip", "non_ip", "bad_hdr"]))
    return 0
