"""``flowpulse fabric up|down|status|drain|restore|ping``: build, change, inspect and remove a testbed."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.site import CounterSource
from flowpulse.argtypes import choice, number
from flowpulse.cmdbase import Formatter, add_common, emit, table
from flowpulse.errors import SpecError
from netns_testbed.hooks import Hook
from netns_testbed.topo import FabricSpec, SprayMode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fabric", help="build, inspect and remove the namespace testbed", formatter_class=Formatter)
    fsub = p.add_subparsers(dest="fabric_cmd", metavar="ACTION", required=True)

    up = fsub.add_parser("up", help="build a leaf-spine fabric with the eBPF datapath", formatter_class=Formatter,
                         epilog="examples:\n  sudo flowpulse fabric up\n"
                                "  sudo flowpulse fabric up --prefix t2 --leaves 2 --spines 3 --hosts-per-leaf 1\n"
                                "  sudo flowpulse fabric up --spray random --out-of-service 'leaf0<->spine1'\n"
                                "  sudo flowpulse fabric up --leaves 16 --spines 16 --hook clsact   # builds faster, runs slower\n"
                                "spray modes:\n" + SprayMode.described())
    add_fabric_args(up)
    add_common(up)
    up.add_argument("--dump-bpf", action="store_true", help=argparse.SUPPRESS)
    up.set_defaults(func=cmd_up)

    down = fsub.add_parser("down", help="remove a testbed (idempotent)", formatter_class=Formatter,
                           epilog="examples:\n  sudo flowpulse fabric down\n  sudo flowpulse fabric down --prefix t2\n"
                                  "  sudo flowpulse fabric down --all     # every testbed, also after a SIGKILL\n")
    add_common(down)
    down.add_argument("--all", action="store_true", help="remove every FlowPulse testbed on this machine")
    down.set_defaults(func=cmd_down)

    st = fsub.add_parser("status", help="show testbeds and their settings", formatter_class=Formatter,
                         epilog="examples:\n  sudo flowpulse fabric status\n  sudo flowpulse fabric status --json\n")
    add_common(st)
    st.set_defaults(func=cmd_status)

    ex = fsub.add_parser(
        "export-site", help="write the site file of a testbed switch (for flowpulse agent --site)",
        formatter_class=Formatter,
        epilog="examples:\n  flowpulse fabric export-site --switch spine2 > spine2.yaml\n"
               "  flowpulse fabric export-site --all --dir sites/\n"
               "  sudo ip netns exec fp-spine2 flowpulse agent --site sites/spine2.yaml --state-dir /var/lib/flowpulse/spine2\n"
               "A site file describes one switch as an agent on any machine needs it (agent/site.py):\n"
               "the testbed is then one site among others.")
    who = ex.add_mutually_exclusive_group(required=True)
    who.add_argument("--switch", help="the switch to describe (written to stdout or --out)")
    who.add_argument("--all", action="store_true", help="every switch, one <switch>.yaml each in --dir")
    ex.add_argument("--out", type=Path, help="with --switch: write here instead of stdout")
    ex.add_argument("--dir", type=Path, help="with --all: an existing directory for the files")
    ex.add_argument("--counters", type=choice(CounterSource), choices=list(CounterSource), default=CounterSource.EBPF,
                    help="the counter source the files name (netlink: interface statistics, no BPF)")
    add_common(ex)
    ex.set_defaults(func=cmd_export_site)

    dr = fsub.add_parser(
        "drain", help="stop spraying over leaf-spine links, while jobs run", formatter_class=Formatter,
        epilog="examples:\n  sudo flowpulse fabric drain 'leaf2->spine1'\n"
               "  sudo flowpulse fabric drain 'leaf0<->spine3' --min-spines 2\n"
               "A drained leafA->spineK takes spine K out of leaf A's spray tables; a drained spineK->leafL\n"
               "takes it out of every leaf's table towards leaf L. Each leaf switches its tables at once;\n"
               "running agents take the new shares at the same moment (no alert, nothing relearned).\n"
               "Refused, nothing changed (exit 4): a drain that leaves a leaf fewer than --min-spines\n"
               "spines towards another leaf. Draining a drained link changes nothing (exit 0).")
    dr.add_argument("links", nargs="+", metavar="LINK", help="a->b, or a<->b for both directions")
    dr.add_argument("--min-spines", type=int, default=1,
                    help="spines every leaf must keep towards every other leaf")
    add_common(dr)
    dr.set_defaults(func=cmd_drain)

    rs = fsub.add_parser(
        "restore", help="spray over drained links again", formatter_class=Formatter,
        epilog="examples:\n  sudo flowpulse fabric restore 'leaf2->spine1'\n  sudo flowpulse fabric restore --all\n"
               "Links out of service since `fabric up --out-of-service` stay out.")
    rs.add_argument("links", nargs="*", metavar="LINK", help="a->b, or a<->b for both directions")
    rs.add_argument("--all", action="store_true", help="every drained link")
    add_common(rs)
    rs.set_defaults(func=cmd_restore)

    pg = fsub.add_parser("ping", help="all-pairs ICMP reachability between hosts", formatter_class=Formatter,
                         epilog="examples:\n  sudo flowpulse fabric ping\n  sudo flowpulse fabric ping --prefix t2 --json\n")
    add_common(pg)
    pg.add_argument("--count", type=int, default=1, help="echo requests per pair")
    pg.add_argument("--timeout", type=number(0, 60, above=True), default=1.0, help="seconds to wait for each reply")
    pg.set_defaults(func=cmd_ping)


def add_fabric_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaves", type=int, default=4, help="leaf switches")
    p.add_argument("--spines", type=int, default=4, help="spine switches")
    p.add_argument("--hosts-per-leaf", type=int, default=2, help="hosts under each leaf")
    p.add_argument("--mtu", type=int, default=1500, help="MTU of every link (jumbo up to 9000)")
    p.add_argument("--spray", type=choice(SprayMode), choices=list(SprayMode), default=SprayMode.RRDST,
                   help="per-packet spray mode at the leaves")
    p.add_argument("--gap-ms", type=number(0, 10000, above=True), default=50.0, help="idle gap (ms) that ends a traffic pulse")
    p.add_argument("--weight", action="append", default=[], metavar="LINK=W",
                   help="spray weight of a leaf->spine uplink (repeatable; default 1)")
    p.add_argument("--out-of-service", action="append", default=[], metavar="LINK",
                   help="leaf<->spine link taken out of spraying and routing (repeatable)")
    p.add_argument("--no-datapath", action="store_true", help="plain kernel ECMP, no eBPF (baseline)")
    p.add_argument("--offloads", action="store_true", help="leave TSO/GSO/GRO on (one skb is then many frames)")
    p.add_argument("--hook", type=choice(Hook), choices=list(Hook), default=None,
                   help="how the programs attach to ports: tcx links (kernel 6.6+) or tc clsact; "
                        "default: tcx where the kernel has it, else clsact")


def options_from_args(args: argparse.Namespace):
    from netns_testbed.builder import UpOptions

    weights = {}
    for item in args.weight:
        link, sep, w = item.rpartition("=")
        if not sep:
            raise SpecError(f"bad --weight {item!r}: write LINK=W, e.g. leaf0->spine1=2")
        try:
            weights[link] = float(w)
        except ValueError:
            raise SpecError(f"bad --weight {item!r}: W must be a number") from None
    spec = FabricSpec(leaves=args.leaves, spines=args.spines, hosts_per_leaf=args.hosts_per_leaf, mtu=args.mtu)
    return spec, UpOptions(spray=args.spray, gap_ms=args.gap_ms, weights=weights,
                           out_of_service=args.out_of_service, datapath=not args.no_datapath,
                           offloads=args.offloads, hook=args.hook)


def cmd_up(args: argparse.Namespace) -> int:
    from netns_testbed import builder
    from netns_testbed.datapath import SwitchShape, bpf_source_with_flags
    from netns_testbed.topo import Fabric

    spec, opts = options_from_args(args)
    if args.dump_bpf:
        fabric = Fabric(spec)
        print(bpf_source_with_flags(SwitchShape.of(fabric, fabric.leaves[0])))
        return 0
    tb = builder.up(args.prefix, spec, opts, progress=lambda m: print(f"[{args.prefix}] {m}", file=sys.stderr))
    emit(args, builder.status(args.prefix), lambda s: f"testbed {tb.prefix}: {len(tb.fabric.leaves)} leaves, "
         f"{len(tb.fabric.spines)} spines, {len(tb.fabric.hosts)} hosts, spray {opts.spray}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from netns_testbed import builder
    from netns_testbed.nsutil import require_root

    require_root()
    prefixes = sorted(builder.list_testbeds()) if args.all else [args.prefix]
    result = {p: len(builder.down(p)) for p in prefixes}
    emit(args, result, lambda r: "\n".join(f"testbed {p}: removed {n} namespaces" for p, n in r.items()) or "nothing to remove")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from netns_testbed import builder

    beds = builder.list_testbeds()
    if args.prefix in beds or not beds:
        data = [builder.status(args.prefix)]
    else:
        data = [builder.status(p) for p in sorted(beds)]
    emit(args, data, lambda d: table(d, ["prefix", "status", "namespaces", "spray", "hook", "faults", "drained", "healthy"]))
    return 0 if all(d.get("healthy") for d in data) else 1


def _spray_change(args: argparse.Namespace, tb, change, verb: str) -> int:
    """Report a drain or restore; ``tb`` holds the state the change left (drain.py reads it under the lock)."""
    from netns_testbed.drain import as_dict

    data = {"changed": change is not None, "change": as_dict(change), "drained": [l.name for l in tb.drained]}
    emit(args, data, lambda d: (f"{verb} {', '.join(d['change']['links'])} in "
                                f"{(d['change']['t1_ns'] - d['change']['t0_ns']) / 1e6:.1f} ms"
                                if d["changed"] else "nothing to change")
         + f"; drained now: {', '.join(d['drained']) or 'none'}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    from netns_testbed import drain
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed
    from netns_testbed.topo import largest_fabric

    largest_fabric().parse_link_list(args.links)      # a malformed link is told before the testbed is looked for
    tb = Testbed.load(args.prefix)
    links = tb.fabric.parse_link_list(args.links)
    tb.fabric.check_drain(tb.out_of_service, links, args.min_spines)   # refused before anything is touched
    require_root()
    return _spray_change(args, tb, drain.drain(tb, links, args.min_spines), "drained")


def cmd_restore(args: argparse.Namespace) -> int:
    from netns_testbed import drain
    from netns_testbed.nsutil import require_root
    from netns_testbed.state import Testbed
    from netns_testbed.topo import largest_fabric

    if bool(args.links) == args.all:
        raise SpecError("name the links to restore, or give --all (not both)")
    if args.links:
        largest_fabric().parse_link_list(args.links)
    tb = Testbed.load(args.prefix)
    links = None if args.all else tb.fabric.parse_link_list(args.links)
    require_root()
    return _spray_change(args, tb, drain.restore(tb, links), "restored")


def cmd_ping(args: argparse.Namespace) -> int:
    from netns_testbed.nsutil import require_root
    from netns_testbed.ping import all_pairs
    from netns_testbed.state import Testbed

    from flowpulse.errors import SpecError

    if not 1 <= args.count <= 1000:
        raise SpecError(f"bad --count {args.count}: echo requests per pair, 1..1000")
    require_root()
    tb = Testbed.load(args.prefix)
    results = all_pairs(tb, args.count, args.timeout)
    rows = [{"src": r.src, "dst": r.dst, "sent": r.sent, "received": r.received,
             "rtt_ms": None if r.rtt_ms is None else round(r.rtt_ms, 3)} for r in results]
    bad = [r for r in results if not r.ok]
    emit(args, {"pairs": len(rows), "failed": len(bad), "results": rows},
         lambda d: (table([r for r in rows if not r["received"]], ["src", "dst", "sent", "received"]) + "\n" if bad else "")
         + f"{d['pairs'] - d['failed']}/{d['pairs']} host pairs reachable")
    return 1 if bad else 0


def cmd_export_site(args: argparse.Namespace) -> int:
    from agent.site import dump_site, site_of_testbed
    from netns_testbed.state import Testbed

    if args.all and not args.dir:
        raise SpecError("--all writes one file per switch: give --dir DIR (an existing directory)")
    if args.switch and args.dir:
        raise SpecError("--dir goes with --all; with --switch use --out FILE or stdout")
    if args.all and args.out:
        raise SpecError("--out goes with --switch; with --all use --dir DIR")
    if args.dir and not args.dir.is_dir():
        raise SpecError(f"--dir {args.dir}: not an existing directory; create it first")
    if args.out and (args.out.is_dir() or not args.out.parent.is_dir()):
        raise SpecError(f"--out {args.out}: name a file in an existing directory")
    tb = Testbed.load(args.prefix)
    switches = tb.fabric.switches if args.all else [args.switch]
    sites = {sw: dump_site({**site_of_testbed(tb, sw), "counters": args.counters.value}) for sw in switches}   # every one checked before any is written
    if args.all:
        for sw, text in sites.items():
            (args.dir / f"{sw}.yaml").write_text(text)
        emit(args, {"written": [str(args.dir / f"{sw}.yaml") for sw in switches]},
             lambda d: f"wrote {len(d['written'])} site files in {args.dir}")
    elif args.out:
        args.out.write_text(sites[args.switch])
        emit(args, {"written": [str(args.out)]}, lambda d: f"wrote {args.out}")
    else:
        sys.stdout.write(sites[args.switch])
    return 0
