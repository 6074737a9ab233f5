"""``flowpulse fault add|clear|list``: silent faults on live links."""
from __future__ import annotations

import argparse

from flowpulse.cmdbase import Formatter, add_common, emit, table
from flowpulse.argtypes import choice
from netns_testbed.faults import Backend


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fault", help="set, change, list and clear link faults", formatter_class=Formatter)
    fsub = p.add_subparsers(dest="fault_cmd", metavar="ACTION", required=True)
    add = fsub.add_parser(
        "add", help="set (or change) the fault on a directed link", formatter_class=Formatter,
        epilog="FAULT is LINK:KIND[=RATE][,MOD=V...]; kinds drop, corrupt, blackhole, partial, delay (netem);\n"
               "modifiers src=, dst= (host, leaf or CIDR), flows=FRACTION, flap=ON/OFF seconds (bpf only).\n"
               "examples:\n  sudo flowpulse fault add 'leaf1->spine2:drop=0.01'\n"
               "  sudo flowpulse fault add 'spine0->leaf3:corrupt=0.015'\n"
               "  sudo flowpulse fault add 'leaf1->spine2:drop=0.05,src=h1,dst=h6'\n"
               "  sudo flowpulse fault add 'leaf0->spine1:partial=0.25'\n"
               "  sudo flowpulse fault add 'h2->leaf1:blackhole,flap=1/3'\n"
               "  sudo flowpulse fault add --backend netem 'spine1->leaf0:delay=5ms'\n")
    add.add_argument("fault", metavar="FAULT")
    add.add_argument("--backend", type=choice(Backend), choices=list(Backend), default=Backend.BPF,
                     help="bpf: the datapath's exact injector (all kinds but delay); netem: the kernel's netem "
                          "qdisc (drop, blackhole, corrupt, delay on a whole link), where the kernel has sch_netem")
    add_common(add)
    add.set_defaults(func=cmd_add)
    clr = fsub.add_parser("clear", help="clear the fault on a link (a->b or a<->b), or all", formatter_class=Formatter,
                          epilog="examples:\n  sudo flowpulse fault clear 'leaf1->spine2'\n"
                                 "  sudo flowpulse fault clear 'leaf1<->spine2'\n  sudo flowpulse fault clear --all\n")
    clr.add_argument("link", metavar="LINK", nargs="?")
    clr.add_argument("--all", action="store_true", help="clear every fault")
    add_common(clr)
    clr.set_defaults(func=cmd_clear)
    ls = fsub.add_parser("list", help="active faults with the injector's counts", formatter_class=Formatter,
                         epilog="examples:\n  sudo flowpulse fault list\n  sudo flowpulse fault list --json\n")
    add_common(ls)
    ls.set_defaults(func=cmd_list)


def cmd_add(args: argparse.Namespace) -> int:
    from netns_testbed import faults
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed
    from netns_testbed.topo import largest_fabric

    faults.parse_fault(largest_fabric(), args.fault)     # a malformed spec is told before the testbed is looked for
    require_root()
    tb = Testbed.load(args.prefix)
    spec = faults.parse_fault(tb.fabric, args.fault)
    backend = args.backend
    faults.check_backend(spec, backend)
    replaced = faults.apply(tb, spec, backend=backend)
    emit(args, {"link": spec.link.name, "fault": spec.describe(), "replaced": replaced},
         lambda d: f"{'changed' if replaced else 'set'} {d['fault']}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from flowpulse.errors import SpecError
    from netns_testbed import faults
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed
    from netns_testbed.topo import largest_fabric

    require_root()
    if not args.link and not args.all:
        raise SpecError("fault clear needs a LINK (e.g. leaf1->spine2) or --all")
    if args.link:
        largest_fabric().parse_link(args.link)
    tb = Testbed.load(args.prefix)
    cleared = faults.clear(tb, None if args.all else args.link)
    emit(args, {"cleared": cleared}, lambda d: f"cleared {', '.join(cleared)}" if cleared else "no fault to clear")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from netns_testbed import faults
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed

    require_root()
    rows = faults.listing(Testbed.load(args.prefix))
    emit(args, rows, lambda r: table(r, ["link", "fault", "at", "matched", "hit"]))
    return 0
