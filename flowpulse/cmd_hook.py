"""``flowpulse nexthop-hook``: the drain action on a Linux leaf (Alertmanager's routing receiver)."""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from flowpulse.argtypes import SECONDS
from flowpulse.cmdbase import Formatter, add_common


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nexthop-hook", help="on a Linux leaf: take drained links' nexthops out of its routes (webhook)",
        formatter_class=Formatter,
        epilog="examples:\n  sudo flowpulse nexthop-hook --site /etc/flowpulse/leaf2.yaml\n"
               "  sudo flowpulse nexthop-hook --site leaf2.yaml --listen 127.0.0.1 --port 9096 --duration 600\n"
               "Alertmanager's routing receiver (deploy/alertmanager/alertmanager.yml) posts the\n"
               "FlowPulseLinkDrained alert here. For a drained leafA->spineK on leaf A, every route to\n"
               "another leaf loses its nexthop towards spine K; for spineK->leafL on another leaf, the\n"
               "routes to leaf L's prefixes do. The alert's resolve gives the nexthops back. See\n"
               "agent/nexthops.py.")
    p.add_argument("--site", type=Path, required=True, metavar="FILE", help="this leaf's site file (YAML)")
    p.add_argument("--listen", default="127.0.0.1", help="address to receive notifications on")
    p.add_argument("--port", type=int, default=9096, help="TCP port to receive notifications on")
    p.add_argument("--duration", type=SECONDS, default=None, help="stop after this many seconds")
    add_common(p, prefix=False, json_out=False)
    p.set_defaults(func=cmd_nexthop_hook)


def cmd_nexthop_hook(args: argparse.Namespace) -> int:
    from agent.nexthops import NexthopHook, serve
    from agent.site import load_site
    from flowpulse.errors import EnvironmentProblem, SpecError
    from netns_testbed.nsutil import require_root

    if not 1 <= args.port <= 65535:
        raise SpecError(f"bad --port {args.port}: a TCP port in 1-65535")
    hook = NexthopHook(load_site(args.site))
    require_root()
    try:
        server = serve(hook, args.listen, args.port)
    except OSError as e:
        raise EnvironmentProblem(f"cannot listen on {args.listen}:{args.port}: {e.strerror}; pick another "
                                 "--port or --listen") from None
    print(f"nexthop hook for {hook.site.switch} on http://{args.listen}:{args.port}/", file=sys.stderr)
    stop = threading.Event()
    try:
        stop.wait(args.duration)
    except KeyboardInterrupt:
        return 130
    finally:
        server.shutdown()
    return 0
