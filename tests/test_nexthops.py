"""The drain action on a Linux leaf (root): Alertmanager notifications posted to the nexthop hook's
receiver on loopback take the drained link's nexthops out of the leaf's kernel routes and give them
back at the resolve; links of other boxes change nothing."""
from __future__ import annotations

import json
import urllib.request

import pytest

from agent.nexthops import NexthopHook, serve
from agent.site import load_site, site_of_testbed
from netns_testbed.nsutil import iproute

pytestmark = pytest.mark.root


def _via(tb, leaf: str, prefix: str) -> set[str]:
    """The interfaces the leaf's route to ``prefix`` leaves by."""
    net, plen = prefix.split("/")
    with iproute(tb.ns(leaf)) as ipr:
        names = {l["index"]: l.get_attr("IFLA_IFNAME") for l in ipr.get_links()}
        for r in ipr.get_routes(family=2):
            if r.get_attr("RTA_DST") == net and r["dst_len"] == int(plen):
                mp = r.get_attr("RTA_MULTIPATH")
                return {names[h["oif"]] for h in mp} if mp else {names[r.get_attr("RTA_OIF")]}
    return set()


def _post(url: str, status: str, *links: str) -> None:
    body = {"receiver": "routing", "status": status,
            "alerts": [{"status": status, "labels": {"alertname": "FlowPulseLinkDrained", "link": l,
                                                     "incident": l, "severity": "action"}} for l in links]}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(req, timeout=5).status == 200


def test_drain_alerts_change_a_linux_leafs_routes(make_testbed, tmp_path):
    tb = make_testbed(leaves=3, spines=3, hosts_per_leaf=1)
    path = tmp_path / "leaf0.yaml"
    path.write_text(json.dumps(site_of_testbed(tb, "leaf0")))
    site = load_site(path)
    hook = NexthopHook(site, iproute=lambda: iproute(tb.ns("leaf0")))
    server = serve(hook, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/flowpulse-drain"
    to1, to2 = (str(n) for n in (site.sources["leaf1"][0], site.sources["leaf2"][0]))
    try:
        assert _via(tb, "leaf0", to1) == _via(tb, "leaf0", to2) == {"spine0", "spine1", "spine2"}
        _post(url, "firing", "leaf0->spine1")                   # this box's uplink: every other leaf
        assert _via(tb, "leaf0", to1) == _via(tb, "leaf0", to2) == {"spine0", "spine2"}
        _post(url, "firing", "spine2->leaf2", "leaf1->spine0")  # towards leaf2 only; another box's uplink: nothing
        assert _via(tb, "leaf0", to1) == {"spine0", "spine2"} and _via(tb, "leaf0", to2) == {"spine0"}
        _post(url, "firing", "spine0->leaf2")                   # the last nexthop to leaf2: refused
        assert _via(tb, "leaf0", to2) == {"spine0"}
        _post(url, "resolved", "leaf0->spine1", "spine2->leaf2", "spine0->leaf2")
        assert _via(tb, "leaf0", to1) == _via(tb, "leaf0", to2) == {"spine0", "spine1", "spine2"}
        # a notification that is not JSON is refused, and the hook goes on
        req = urllib.request.Request(url, data=b"[", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(req, timeout=5)
        _post(url, "firing", "leaf0->spine2")
        assert _via(tb, "leaf0", to1) == {"spine0", "spine1"}
    finally:
        server.shutdown()
