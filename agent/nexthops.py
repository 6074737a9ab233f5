"""The drain action on a Linux forwarding box: a leaf's ECMP routes lose (and later regain) the nexthop
over a drained link.

Where FlowPulse does not own routing, a drain reaches the fabric as the ``FlowPulseLinkDrained``
alert, which Alertmanager sends to its routing receiver (deploy/alertmanager/alertmanager.yml). On a
leaf that is a Linux box, ``flowpulse nexthop-hook --site FILE`` is that receiver: its site file says
which switch the box is, which interface faces which spine, and which prefixes each leaf owns. For a
firing alert on

* ``leafA->spineK`` with this box leaf A: every route to another leaf's prefixes loses its nexthop
  over the interface that faces spine K;
* ``spineK->leafL`` with this box another leaf: the routes to leaf L's prefixes lose it;

and a resolved alert (the operator restored the link: the series went away) gives the removed
nexthops back as they were (gateway, interface, weight). Anything else (another box's link, a spine's
box, a route with no such nexthop) changes nothing. A route is never left without a nexthop: a drain
that would is refused with a log line (the agents' floor refuses it before, on the testbed).
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from agent.site import Site
from netns_testbed.topo import Link, node_kind

log = logging.getLogger("flowpulse.agent.nexthops")
ALERT = "FlowPulseLinkDrained"
MAX_BODY = 1 << 20        # an Alertmanager notification is a few KiB


class NexthopHook:
    """Applies drain alerts to the routes of the box ``site`` describes (``iproute``: opens a pyroute2
    IPRoute in the right namespace; the box's own by default)."""

    def __init__(self, site: Site, iproute: Callable | None = None) -> None:
        if node_kind(site.switch) != "leaf":
            from netns_testbed.errors import SpecError

            raise SpecError(f"{site.switch}: the nexthop hook runs on a leaf (a spine's routes name no spine)")
        self.site = site
        self.iproute = iproute or _own_iproute
        self.removed: dict[str, list[tuple[str, dict]]] = {}   # link -> (prefix, the nexthop taken out)
        self.lock = threading.Lock()

    def handle(self, payload: dict) -> list[str]:
        """One Alertmanager webhook notification; returns what it did, one line each."""
        done: list[str] = []
        for alert in payload.get("alerts") or []:
            labels = alert.get("labels") or {}
            if labels.get("alertname") != ALERT or not isinstance(labels.get("link"), str):
                continue
            try:
                link = self.site.fabric.parse_link(labels["link"])
            except Exception as e:                # a link of another fabric: nothing here
                log.warning("drain alert for %r ignored: %s", labels["link"], e)
                continue
            with self.lock:
                done += self.drain(link) if alert.get("status") == "firing" else self.restore(link)
        return done

    def _affected(self, link: Link) -> list[tuple[str, str]]:
        """(prefix, interface) pairs whose route must lose its nexthop over the interface."""
        me, f = self.site.switch, self.site.fabric
        if node_kind(link.src) == "leaf" and node_kind(link.dst) == "spine" and link.src == me:
            spine, leaves = link.dst, [l for l in self.site.sources if l != me]
        elif node_kind(link.src) == "spine" and node_kind(link.dst) == "leaf" and link.dst != me:
            spine, leaves = link.src, [link.dst]
        else:
            return []
        ifname = f.port_to(me, spine).ifname
        return [(str(net), ifname) for leaf in sorted(leaves) for net in self.site.sources.get(leaf, ())]

    def drain(self, link: Link) -> list[str]:
        if link.name in self.removed:
            return []
        done, taken = [], []
        with self.iproute() as ipr:
            for prefix, ifname in self._affected(link):
                idx = ipr.link_lookup(ifname=ifname)
                route = _route(ipr, prefix)
                if not idx or route is None:
                    continue
                hops = _hops(route)
                keep = [h for h in hops if h.get("oif") != idx[0]]
                if len(keep) == len(hops):
                    continue
                if not keep:
                    log.warning("drain %s: the route to %s would have no nexthop left: refused", link.name, prefix)
                    continue
                _set_hops(ipr, prefix, keep)
                taken += [(prefix, h) for h in hops if h.get("oif") == idx[0]]
                done.append(f"drain {link.name}: {prefix} no longer via {ifname}")
        if taken:
            self.removed[link.name] = taken
        for line in done:
            log.info("%s", line)
        return done

    def restore(self, link: Link) -> list[str]:
        done = []
        with self.iproute() as ipr:
            for prefix, hop in self.removed.pop(link.name, []):
                route = _route(ipr, prefix)
                hops = _hops(route) if route is not None else []
                if all(h.get("oif") != hop.get("oif") for h in hops):
                    _set_hops(ipr, prefix, hops + [hop])
                    done.append(f"restore {link.name}: {prefix} via {hop.get('gateway')} again")
        for line in done:
            log.info("%s", line)
        return done


def _own_iproute():
    from pyroute2 import IPRoute

    return IPRoute()


def _route(ipr, prefix: str):
    net, plen = prefix.split("/")
    for r in ipr.get_routes(family=2):
        if r.get_attr("RTA_DST") == net and r["dst_len"] == int(plen) and r["table"] == 254:
            return r
    return None


def _hops(route) -> list[dict]:
    """A route's nexthops as pyroute2 takes them back: gateway, interface, weight (hops + 1)."""
    mp = route.get_attr("RTA_MULTIPATH")
    if mp:
        return [{"gateway": h.get_attr("RTA_GATEWAY"), "oif": h["oif"], "hops": h["hops"]} for h in mp]
    return [{"gateway": route.get_attr("RTA_GATEWAY"), "oif": route.get_attr("RTA_OIF"), "hops": 0}]


def _set_hops(ipr, prefix: str, hops: list[dict]) -> None:
    if len(hops) == 1:
        h = hops[0]
        ipr.route("replace", dst=prefix, gateway=h["gateway"], oif=h["oif"])
    else:
        ipr.route("replace", dst=prefix, multipath=[dict(h) for h in hops])


def serve(hook: NexthopHook, addr: str, port: int) -> ThreadingHTTPServer:
    """Alertmanager's webhook receiver on ``addr:port`` (POST, JSON); returns the running server."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            if not 0 < n <= MAX_BODY:
                self.send_response(413 if n else 411)
                self.end_headers()
                return
            try:
                payload = json.loads(self.rfile.read(n))
                if not isinstance(payload, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                log.warning("bad notification from %s: %s", self.client_address[0], e)
                self.send_response(400)
                self.end_headers()
                return
            hook.handle(payload)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((addr, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="flowpulse-nexthop-hook").start()
    return server
