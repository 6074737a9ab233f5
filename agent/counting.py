"""The counting program on a real machine's interfaces, for ``flowpulse agent --site``.

``netns_testbed/bpf/count.c`` is the testbed switch's classify / pulse clock /
count (``bpf/packet.h``) and nothing else: no spraying, no faults, no
forwarding decision. Every packet continues to whatever the machine does next.
Source classes come from the site's address prefixes (an LPM trie).

Attached on ingress and egress of each port the site lists, ahead of anything
the machine already runs there (netns_testbed/hooks.py): where the kernel has
tcx links (6.6+), by a tcx link placed in front of every other tcx program (tcx
runs before clsact); elsewhere with tc clsact at priority 1, ahead of any filter
(a testbed's switch program sits at the kernel's default priority, 49152).
A tcx link lives as long as the agent holds it: a killed agent leaves nothing
attached. On clsact, :meth:`close` removes exactly what it added: its own
filters, and the clsact qdisc only if it created it and nothing else uses it;
filters a killed agent left behind (known by their program names) are removed
before attaching, on either hook.

The maps stay in this process (no pinning): the agent that loaded them reads
them (:class:`CountMaps`), and they go when it exits and its filters are gone.

Two builds of the same C (the site file's ``counters``): ``ebpf`` loads the object compiled with the
package (``bpf/count.bpf.o``, netns_testbed.bpfobject) through libbpf, so that the machine needs no
compiler, LLVM or kernel headers; ``ebpf-bcc`` compiles count.c at start with BCC, as the testbed's
switches are compiled.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import socket
import time

from agent.site import CounterSource, Site
from netns_testbed.errors import EnvironmentProblem, SpecError
from netns_testbed import datapath as dp
from netns_testbed import hooks
from netns_testbed.bpfmaps import PinnedArray, RingWakeups, map_update
from netns_testbed.hooks import Hook

log = logging.getLogger("flowpulse.agent.counting")
SRC = dp.BPF_DIR / "count.c"
PRIO = 1
PROGRAMS = ("fp_count_in", "fp_count_out")
DIRECTION = {"fp_count_in": "ingress", "fp_count_out": "egress"}
PARENTS = {name: hooks.CLSACT_PARENT[d] for name, d in DIRECTION.items()}   # clsact ingress, egress


def shape(site: Site) -> dp.SwitchShape:
    """The counters' shape: the testbed switch's, for the site's ports (no spraying, so no uplinks)."""
    return dp.SwitchShape(len(site.ifnames), site.fabric.spec.leaves, False, 0, 0)


def cflags(site: Site) -> list[str]:
    sh = shape(site)
    return [f"-I{dp.BPF_DIR}", f"-DNPORTS={sh.nports}", f"-DNSRC={sh.nsrc}", f"-DFP_RING={sh.ring}"]


def program_text(site: Site) -> str:
    """count.c and the same contract assertions the switch program compiles with."""
    return dp.source_text(SRC) + "\n" + dp.contract_asserts(shape(site))


def local_ifindexes(site: Site) -> list[int]:
    """This machine's (this network namespace's) ifindex of each port, or one line naming the missing
    interface. (if_nametoindex asks the kernel in the caller's namespace; /sys may show another's.)"""
    idx = []
    for name in site.ifnames:
        try:
            idx.append(socket.if_nametoindex(name))
        except OSError:
            raise SpecError(f"site file {site.path}: ports: no interface {name!r} on this machine: "
                            "fix the name (ip -br link lists them) or run where it exists") from None
    return idx


class CountMaps(dp.CounterMaps):
    """The loaded program's counter and pulse maps, read through copies of its descriptors."""

    def __init__(self, map_fd, site: Site) -> None:
        """``map_fd(name)``: the loaded program's descriptor of its map ``name``."""
        sh = self.shape = shape(site)
        self.nports, self.nsrc = sh.nports, sh.nsrc
        self.maps = {name: PinnedArray(name, t, n, pc, fd=map_fd(name))
                     for name, (t, n, pc) in dp.counter_map_entries(sh).items()}
        self.wakeups = RingWakeups(fd=map_fd(dp.WAKEUPS))

    def identity(self) -> None:
        return None  # held by this process: nobody replaces them


class CountingProgram:
    """Compile, fill, attach; then hand out readers; detach on close."""

    def __init__(self, site: Site, ifindexes: list[int]) -> None:
        self.site = site
        self.bpf = None                 # ebpf-bcc: BCC's module
        self.obj = None                 # ebpf: the compiled object (netns_testbed.bpfobject.CountingObject)
        self.prog_fds: dict[str, int] = {}
        self.ifindexes = ifindexes      # local_ifindexes(site), resolved once by the caller
        self.hook = hooks.choose(None)
        self.attached: list[tuple[int, str]] = []   # clsact: (ifindex, parent)
        self.links: list[int] = []                  # tcx: the links' descriptors
        self.own_qdisc: set[int] = set()
        self.armed_ns: int | None = None            # when every port counted (monotonic ns), after attach()

    def load(self) -> None:
        """Load the program (either build) and fill its ports, pulse gap and source prefixes."""
        if self.site.counters is CounterSource.EBPF_BCC:
            self.bpf, fns = dp.compile_program(program_text(self.site), cflags(self.site), PROGRAMS)
            self.prog_fds = {name: fn.fd for name, fn in fns.items()}
        else:
            from netns_testbed.bpfobject import CountingObject

            self.obj = CountingObject(shape(self.site))
            self.prog_fds = {name: self.obj.prog_fd(name) for name in PROGRAMS}
        for port, ifx in enumerate(self.ifindexes):
            map_update(self.map_fd("ifindex_port"), ct.c_uint32(ifx), ct.c_uint32(port))
        units = max(1, int(round(self.site.gap_ms * 1e6 / dp.PULSE_UNIT_NS)))
        map_update(self.map_fd("config"), ct.c_uint32(0), dp.Config(0, units))
        for net, cls in self.site.source_classes():
            key = dp.PrefixKey(net.prefixlen, dp.net_u32(net.network_address))
            map_update(self.map_fd("source_prefix"), key, ct.c_uint32(cls))

    def map_fd(self, name: str) -> int:
        """The loaded program's descriptor of its map ``name`` (held by the loader: not to be closed)."""
        if self.obj is not None:
            return self.obj.map_fd(name)
        return self.bpf[name.encode()].map_fd

    def _filters(self, ipr, ifx: int, parent: str) -> list[tuple[int, str]]:
        out = []
        for f in ipr.get_filters(ifx, parent=parent):
            opts = f.get_attr("TCA_OPTIONS")
            name = opts.get_attr("TCA_BPF_NAME") if opts else None
            if name:
                out.append((f["info"] >> 16, name))
        return out

    def _drop_leftovers(self, ipr, ifx: int) -> None:
        """Remove the counting filters a killed agent left on the port's clsact (known by their program
        names), whichever hook this agent attaches with: an agent on clsact killed before the machine
        moved to tcx (or run with the hook forced) would otherwise go on running beside this one."""
        from pyroute2.netlink.exceptions import NetlinkError

        for name in PROGRAMS:
            parent = PARENTS[name]
            try:
                filters = self._filters(ipr, ifx, parent)
            except NetlinkError:     # no clsact on the port: nothing left there
                continue
            for prio, fname in filters:
                if fname.startswith("fp_count_"):
                    log.warning("removing a counting filter a previous agent left (ifindex %d prio %d)", ifx, prio)
                    ipr.tc("del-filter", "bpf", ifx, parent=parent, prio=prio)

    def attach(self) -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:           # one netlink session: leftovers first, then the attach
            for ifx in self.ifindexes:
                self._drop_leftovers(ipr, ifx)
            self._attach(ipr)
        self.armed_ns = time.monotonic_ns()     # every port counts from here (agent.reader: armed_ns)

    def _attach(self, ipr) -> None:
        """Both programs on every port (tcx links, or filters on the ports' clsact)."""
        from pyroute2.netlink.exceptions import NetlinkError

        if self.hook is Hook.TCX:
            for ifx in self.ifindexes:
                for name in PROGRAMS:
                    try:
                        self.links.append(hooks.attach_tcx(self.prog_fds[name], ifx, DIRECTION[name], first=True))
                    except OSError as e:
                        raise EnvironmentProblem(f"cannot attach {name} to ifindex {ifx} with tcx: {e.strerror}") \
                            from None
            return
        for ifx in self.ifindexes:
            try:
                ipr.tc("add", "clsact", ifx)
                self.own_qdisc.add(ifx)
            except NetlinkError as e:
                if e.code != 17:  # EEXIST: the machine has one already; share it
                    raise EnvironmentProblem(f"cannot add tc clsact on ifindex {ifx}: {e}") from None
            for name in PROGRAMS:
                parent = PARENTS[name]
                for prio, fname in self._filters(ipr, ifx, parent):
                    if prio == PRIO:
                        raise EnvironmentProblem(f"tc priority {PRIO} on ifindex {ifx} is taken by {fname!r}: "
                                                 "the counter must run first; move that filter")
                ipr.tc("add-filter", "bpf", ifx, ":1", fd=self.prog_fds[name], name=name, parent=parent, classid=1,
                       direct_action=True, prio=PRIO)
                self.attached.append((ifx, parent))

    def maps(self) -> CountMaps:
        return CountMaps(self.map_fd, self.site)

    def close(self) -> None:
        """Detach what this program attached (and a clsact it created and nobody else uses)."""
        for fd in self.links:
            os.close(fd)
        self.links.clear()
        if self.attached or self.own_qdisc:
            self._detach_clsact()
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
        if self.obj is not None:
            self.obj.close()
            self.obj = None
        self.prog_fds = {}

    def _detach_clsact(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            for ifx, parent in self.attached:
                try:
                    ipr.tc("del-filter", "bpf", ifx, parent=parent, prio=PRIO)
                except NetlinkError as e:
                    log.debug("filter on ifindex %d already gone: %s", ifx, e)
            for ifx in self.own_qdisc:
                try:
                    if not any(self._filters(ipr, ifx, p) for p in PARENTS.values()):
                        ipr.tc("del", "clsact", ifx)
                except NetlinkError as e:
                    log.debug("clsact on ifindex %d already gone: %s", ifx, e)
        self.attached.clear()
        self.own_qdisc.clear()
