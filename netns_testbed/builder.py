"""Build and tear down a testbed: namespaces, veths, routes and the eBPF datapath.

``up`` turns a :class:`~netns_testbed.topo.Fabric` into kernel objects, all named
``<prefix>-<node>``; on any failure it calls ``down`` before re-raising, so a failed
build leaves nothing. ``down`` reads the kernel (namespaces, processes, mounts),
not saved state, so it also cleans up after a SIGKILLed builder, and it is
idempotent. The namespaces have no link to the root namespace, hence no route out.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pyroute2 import netns

from netns_testbed.errors import EnvironmentProblem, SpecError, StateError
from netns_testbed import datapath as dp
from netns_testbed import hooks, pidfile
from netns_testbed.bpfmaps import obj_pin
from netns_testbed.hooks import Hook
from netns_testbed.nsutil import (NETNS_RUN_DIR, allow_netns_children, in_netns, iproute, kill_pids, pids_in_netns, require_root, set_offloads,
                                  sysctl)
from netns_testbed.slowdown import slowdown
from netns_testbed.state import RUN_DIR, Testbed, TestbedState, prefix_lock, remove_prefix_lock, state_dir, write_state
from netns_testbed.topo import Fabric, SprayMode, FabricSpec, check_prefix, namespace, node_kind, parse_namespace

log = logging.getLogger("flowpulse.testbed")
OFFLOADS = ("tso", "gso", "gro")


@dataclass
class UpOptions:
    """How to build: spray mode, pulse gap, weights, known-bad links, offloads, the programs' hook
    (None: tcx where the kernel has it, else tc clsact)."""

    spray: SprayMode = SprayMode.RRDST
    gap_ms: float = 50.0
    weights: dict[str, float] | None = None
    out_of_service: list[str] | None = None
    datapath: bool = True
    offloads: bool = False
    hook: Hook | None = None

    def __post_init__(self) -> None:
        self.spray = SprayMode.parse(self.spray)      # a Python caller may name it by its value

    def validate(self, fabric: Fabric) -> None:
        if not 1.0 <= self.gap_ms <= 10_000:
            raise SpecError(f"bad pulse gap {self.gap_ms} ms: must be in [1, 10000]")
        for name, w in (self.weights or {}).items():
            link = fabric.parse_link(name)
            if node_kind(link.src) != "leaf" or node_kind(link.dst) != "spine":
                raise SpecError(f"weight on {name!r}: weights apply to leaf->spine uplinks")
            if not (isinstance(w, (int, float)) and 0 <= w <= 1000):
                raise SpecError(f"bad weight {w!r} for {name}: must be a number in [0, 1000]")
        for text in self.out_of_service or []:
            for link in fabric.parse_links(text):
                if "h" in (node_kind(link.src), node_kind(link.dst)):
                    raise SpecError(f"out-of-service {text!r}: only leaf<->spine links can be routed around")


def list_testbeds() -> dict[str, list[str]]:
    """Prefix -> namespaces, found from the kernel's named namespaces."""
    out: dict[str, list[str]] = {}
    for name in sorted(netns.listnetns()):
        parsed = parse_namespace(name)
        if parsed:
            out.setdefault(parsed[0], []).append(name)
    if RUN_DIR.is_dir():
        for d in RUN_DIR.iterdir():
            if d.is_dir() and (d / "state.json").exists():
                out.setdefault(d.name, [])
    return out


def up(prefix: str, spec: FabricSpec, opts: UpOptions | None = None,
       progress: Callable[[str], None] | None = None) -> Testbed:
    """Build the testbed; returns a handle. Raises UserError subclasses on bad input."""
    opts = opts or UpOptions()
    check_prefix(prefix)
    fabric = Fabric(spec)
    opts.validate(fabric)
    factor = slowdown()              # a bad FLOWPULSE_SLOWDOWN is refused before anything is built
    require_root()
    allow_netns_children(factor)
    if not NETNS_RUN_DIR.parent.exists():
        raise EnvironmentProblem("/var/run is missing: cannot name network namespaces")
    if opts.datapath:
        dp.load_bcc()
        dp.check_headers()
        opts = dataclasses.replace(opts, hook=hooks.choose(opts.hook))   # the caller's options stay as given
    with prefix_lock(prefix, wait_s=0):
        try:
            return _up_locked(prefix, spec, fabric, opts, progress)
        except BaseException:
            if prefix not in list_testbeds():      # nothing of it exists (refused, or removed again)
                remove_prefix_lock(prefix)
            raise


def _up_locked(prefix: str, spec: FabricSpec, fabric: Fabric, opts: UpOptions,
               progress: Callable[[str], None] | None) -> Testbed:
    existing = list_testbeds().get(prefix)
    if existing is not None:
        raise StateError(f"a testbed with prefix {prefix!r} already exists: run `flowpulse fabric down --prefix {prefix}` or pick another --prefix")
    say = progress or log.info
    t0 = time.monotonic()
    state = TestbedState(prefix=prefix, fabric=spec.to_dict(), spray=opts.spray, gap_ms=opts.gap_ms,
                         weights=dict(opts.weights or {}), out_of_service=list(opts.out_of_service or []),
                         datapath=opts.datapath, status="building", created=time.time(),
                         hook=opts.hook or Hook.CLSACT)
    try:
        write_state(state)
        say(f"creating {len(fabric.nodes)} namespaces")
        _make_namespaces(prefix, fabric)
        say(f"creating {len(fabric.links()) // 2} links")
        ifindexes = _make_links(prefix, fabric, opts)
        _make_routes(prefix, fabric, Testbed(state).out_of_service, ifindexes)
        if opts.datapath:
            say(f"compiling and attaching the eBPF datapath on {len(fabric.switches)} switches ({opts.hook.label})")
            _attach_datapath(prefix, fabric, state, ifindexes, _make_sinks(prefix, fabric))
        state.status = "up"
        write_state(state)
    except BaseException:
        log.error("build of testbed %r failed; removing what was built", prefix)
        _down_locked(prefix)      # (up's own handler then removes the lock file: nothing is left)
        raise
    say(f"testbed {prefix!r} is up ({time.monotonic() - t0:.1f} s)")
    return Testbed(state)


def _make_namespaces(prefix: str, fabric: Fabric) -> None:
    for node in fabric.nodes:
        name = namespace(prefix, node)
        netns.create(name)
        switch = node_kind(node) != "h"
        for key, value in (
            ("net.ipv4.ip_forward", int(switch)),
            ("net.ipv4.conf.all.rp_filter", 0),
            ("net.ipv4.conf.default.rp_filter", 0),
            ("net.ipv6.conf.all.disable_ipv6", 1),   # no IPv6 chatter (RS, MLD) on the fabric
            ("net.ipv6.conf.default.disable_ipv6", 1),
            ("net.ipv4.fib_multipath_hash_policy", 1),  # kernel ECMP baseline: per 5-tuple
        ):
            sysctl(name, key, value)
        with iproute(name) as ipr:
            ipr.link("set", index=1, state="up")      # the loopback is index 1 in every namespace


def _make_links(prefix: str, fabric: Fabric, opts: UpOptions) -> dict[str, list[int]]:
    """veth per link, created straight into both namespaces (nothing in the root one)."""
    mtu = fabric.spec.mtu
    for leaf in fabric.leaves:  # every link has a leaf end: create each veth once, from there
        with iproute(namespace(prefix, leaf)) as ipr:
            for p in fabric.ports[leaf]:
                peer = fabric.port(p.peer, p.peer_index)
                ipr.link("add", ifname=p.ifname, kind="veth", mtu=mtu,
                         peer={"ifname": peer.ifname, "net_ns_fd": namespace(prefix, p.peer), "mtu": mtu})
    ifindexes: dict[str, list[int]] = {}
    for node in fabric.nodes:
        name = namespace(prefix, node)
        with iproute(name) as ipr:
            # one dump per namespace (link_lookup dumps every link of the namespace at each call)
            by_name = {l.get_attr("IFLA_IFNAME"): l["index"] for l in ipr.get_links()}
            idx = []
            for p in fabric.ports[node]:
                i = by_name[p.ifname]
                ipr.addr("add", index=i, address=str(p.address.ip), prefixlen=p.address.network.prefixlen)
                ipr.link("set", index=i, state="up")
                idx.append(i)
            ifindexes[node] = idx
        if not opts.offloads:   # segmentation offloads off: one skb is one wire frame (spray, drops, counts)
            set_offloads(name, [p.ifname for p in fabric.ports[node]], OFFLOADS, False)
    return ifindexes


SINK_IFNAME = "fpsink"   # per switch: a veth pair left down, no port; injected drops go there (switch.c fault_drop)


def _make_sinks(prefix: str, fabric: Fabric) -> dict[str, int]:
    """Each switch's sink: made after its ports, so that the ports keep the low interface indices the
    datapath's port table holds. Down, so the kernel discards what is sent to it and counts it there
    only: no port's statistics show an injected fault."""
    sinks = {}
    for sw in fabric.switches:
        with iproute(namespace(prefix, sw)) as ipr:
            ipr.link("add", ifname=SINK_IFNAME, kind="veth", peer={"ifname": SINK_IFNAME + "-peer"})
            sinks[sw] = ipr.link_lookup(ifname=SINK_IFNAME)[0]
    return sinks


def _make_routes(prefix: str, fabric: Fabric, out_of_service, ifindexes: dict[str, list[int]]) -> None:
    oos = {l.name for l in out_of_service}
    for host in fabric.hosts:
        leaf_port = fabric.port_to(fabric.host_leaf(host), host)
        with iproute(namespace(prefix, host)) as ipr:
            # Only the fabric's 10/8: anything else has no route at all.
            ipr.route("add", dst="10.0.0.0/8", gateway=str(leaf_port.address.ip))
    for leaf in fabric.leaves:
        with iproute(namespace(prefix, leaf)) as ipr:
            for dst in fabric.leaves:
                if dst == leaf:
                    continue
                hops = []
                for up_port in fabric.uplinks(leaf):
                    spine = up_port.peer
                    if f"{leaf}->{spine}" in oos or f"{spine}->{dst}" in oos:
                        continue
                    gw = fabric.port(spine, up_port.peer_index).address.ip
                    hops.append({"gateway": str(gw), "oif": ifindexes[leaf][up_port.index]})
                if not hops:
                    continue
                net = Fabric.leaf_subnet(dst)
                if len(hops) == 1:
                    ipr.route("add", dst=str(net), gateway=hops[0]["gateway"])
                else:
                    ipr.route("add", dst=str(net), multipath=hops)
    for spine in fabric.spines:
        with iproute(namespace(prefix, spine)) as ipr:
            for p in fabric.ports[spine]:
                gw = fabric.port(p.peer, p.peer_index).address.ip
                ipr.route("add", dst=str(Fabric.leaf_subnet(p.peer)), gateway=str(gw))


def _attach_datapath(prefix: str, fabric: Fabric, state: TestbedState, ifindexes: dict[str, list[int]],
                     sinks: dict[str, int]) -> None:
    sdir = state_dir(prefix)
    bpffs = sdir / "bpf"
    bpffs.mkdir(parents=True, exist_ok=True)
    # bpffs outside /sys: `ip netns exec` remounts /sys and would hide it.
    # mode 0700: only root sees or creates pins (no local user can plant or remove a map mid-build)
    r = subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", f"{prefix}-bpffs", str(bpffs)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise EnvironmentProblem(f"cannot mount bpffs at {bpffs} ({r.stderr.strip()}): the kernel needs CONFIG_BPF_SYSCALL")
    tb = Testbed(state)
    hook = state.hook
    loader = dp.Loader()          # one compile per program shape: the leaves share one, the spines another
    for sw in fabric.switches:
        prog = loader.load(dp.SwitchShape.of(fabric, sw))
        try:
            dp.pin_maps(prog, dp.pin_dir(sdir, sw))
            maps = dp.SwitchMaps(fabric, sdir, sw)
            try:
                maps.set_ports(ifindexes[sw])
                maps.set_config(state.spray, state.gap_ms, sinks[sw])
                maps.set_spray(state.weights, tb.out_of_service)
            finally:
                maps.close()
            progs = {"ingress": (prog.progs["fp_ingress"], "fp_ingress"), "egress": (prog.progs["fp_egress"], "fp_egress")}
            if hook is Hook.TCX:
                # one link per port and direction, pinned beside the switch's maps: the links live as long
                # as the bpffs (down unmounts it) or the port (its namespace goes first)
                with in_netns(namespace(prefix, sw)):
                    for port, idx in zip(fabric.ports[sw], ifindexes[sw]):
                        for d, (fd, _) in progs.items():
                            lfd = hooks.attach_tcx(fd, idx, d)
                            try:
                                obj_pin(lfd, str(dp.link_pin(sdir, sw, port.index, d)))
                            finally:
                                os.close(lfd)
            else:
                with iproute(namespace(prefix, sw)) as ipr:
                    for idx in ifindexes[sw]:
                        hooks.attach_clsact(ipr, idx, progs)
        finally:
            prog.close()


def down(prefix: str) -> list[str]:
    """Remove everything of testbed ``prefix``; safe to call any number of times.

    Order: kill processes inside its namespaces and its agents, delete the
    namespaces (their veths, tc filters and programs go with them), unmount its
    bpffs (pinned maps go with it), remove its state directory.
    """
    check_prefix(prefix)
    require_root()
    with prefix_lock(prefix):
        removed = _down_locked(prefix)
        remove_prefix_lock(prefix)
    return removed


def _down_locked(prefix: str) -> list[str]:
    removed: list[str] = []
    names = [n for n in netns.listnetns() if (parse_namespace(n) or ("", ""))[0] == prefix]
    # agents: only the processes their pid files prove (start time, through a pidfd) are still theirs
    pidfile.kill_owned(_agent_pidfiles(prefix), grace=0.5)
    pids = sorted({pid for n in names for pid in pids_in_netns(n)})
    if pids:
        kill_pids(pids, grace=0.5)
    for name in names:
        try:
            netns.remove(name)
            removed.append(name)
        except FileNotFoundError:
            pass
    sdir = state_dir(prefix)
    bpffs = sdir / "bpf"
    if dp.bpffs_mounted(bpffs):
        subprocess.run(["umount", "-l", str(bpffs)], capture_output=True)
    if sdir.exists():
        shutil.rmtree(sdir, ignore_errors=True)
    return removed


def _agent_pidfiles(prefix: str) -> list[Path]:
    """Agents and other helpers run in the root namespace; they leave pid files (netns_testbed.pidfile)."""
    d = state_dir(prefix) / "pids"
    return sorted(d.glob("*.pid")) if d.is_dir() else []


def status(prefix: str) -> dict:
    """What the kernel and the state file say about one testbed."""
    names = list_testbeds().get(prefix)
    if names is None:
        raise StateError(f"no testbed with prefix {prefix!r}: `flowpulse fabric up --prefix {prefix}` builds one")
    out: dict = {"prefix": prefix, "namespaces": len(names)}
    try:
        tb = Testbed.load(prefix)
        out.update({"status": tb.state.status, "fabric": tb.state.fabric, "spray": tb.state.spray,
                    "gap_ms": tb.state.gap_ms, "out_of_service": tb.state.out_of_service,
                    "drained": tb.state.drained, "faults": sorted(tb.state.faults), "datapath": tb.state.datapath,
                    "hook": tb.state.hook.label if tb.state.datapath else None, "kernel": os.uname().release,
                    "expected_namespaces": len(tb.fabric.nodes)})
        out["healthy"] = len(names) == len(tb.fabric.nodes)
    except StateError as e:
        out.update({"status": "broken", "error": str(e), "healthy": False})
    return out


def set_spray_mode(tb: Testbed, mode: SprayMode) -> None:
    """Switch every leaf's spray mode live (the programs read it per packet)."""
    mode = SprayMode.parse(mode)
    with tb.locked():
        for leaf in tb.fabric.leaves:
            m = tb.maps(leaf)
            try:
                m.set_config(mode, tb.state.gap_ms)
            finally:
                m.close()
        tb.state.spray = mode
        tb.save()
