"""How a program hooks into a port: a tcx link (kernel 6.6+) or a tc clsact filter.

tcx is the kernel's newer hook for tc programs: a BPF link per program and direction, no qdisc, no
classifier chain walked per packet; it runs before clsact's filters on the same port. The testbed's
switch programs use tcx where the kernel has it and clsact elsewhere (``--hook`` picks one); the
site agent's counting program follows the same rule with ``first=True``, so it counts every packet
before a switch program (or anything else on the port) redirects it.

A tcx link lives as long as its descriptor or a pin of it: the testbed pins its links in its own
bpffs (``fabric down`` unmounts it, and the ports go with their namespaces); an agent holds its
links' descriptors, so a killed agent leaves nothing attached.
"""
from __future__ import annotations

import os

from netns_testbed import bpfmaps
from netns_testbed.errors import EnvironmentProblem
from netns_testbed.topo import Hook

DIRECTIONS = ("ingress", "egress")
TCX_ATTACH = {"ingress": bpfmaps.BPF_TCX_INGRESS, "egress": bpfmaps.BPF_TCX_EGRESS}
CLSACT_PARENT = {"ingress": "ffff:fff2", "egress": "ffff:fff3"}
CLSACT_PARENT_ID = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}

__all__ = ["Hook", "attach_clsact", "attach_tcx", "choose"]   # Hook: the vocabulary's (netns_testbed.topo)


def choose(want: Hook | None) -> Hook:
    """The hook to use: ``want``, or (None) tcx where the kernel has it, else clsact. Asking for tcx on
    a kernel without it is an environment problem (exit 3)."""
    have = bpfmaps.tcx_supported()
    if want is None:
        return Hook.TCX if have else Hook.CLSACT
    if want is Hook.TCX and not have:
        raise EnvironmentProblem(f"kernel {os.uname().release} has no tcx links (6.6+): "
                                 "leave --hook out or use --hook clsact")
    return want


def attach_tcx(prog_fd: int, ifindex: int, direction: str, first: bool = False) -> int:
    """A tcx link of ``prog_fd`` on ``ifindex`` (the calling thread's namespace), at the end of the
    port's tcx programs, or in front of all of them (``first``); returns the link's descriptor."""
    return bpfmaps.link_create_tcx(prog_fd, ifindex, TCX_ATTACH[direction],
                                   bpfmaps.BPF_F_BEFORE if first else 0)


def attach_clsact(ipr, ifindex: int, progs: dict[str, tuple[int, str]]) -> None:
    """A clsact qdisc on ``ifindex`` (pyroute2 IPRoute ``ipr`` of its namespace) and a direct-action
    bpf filter per direction of ``progs`` ({direction: (fd, name)}). (The site agent's counter shares
    a clsact the machine may have and picks its priority: agent/counting.py.)"""
    ipr.tc("add", "clsact", ifindex)
    for direction, (fd, name) in progs.items():
        ipr.tc("add-filter", "bpf", ifindex, ":1", fd=fd, name=name, parent=CLSACT_PARENT[direction], classid=1,
               direct_action=True)


TCA_BPF_ID = 11     # include/uapi/linux/pkt_cls.h: the filter's program id (pyroute2 leaves it undecoded)


def _bpf_filter_id(f) -> int | None:
    """The program id of a bpf filter message, or None (the chain's head entry carries no options)."""
    opts = f.get_attr("TCA_OPTIONS")
    for slot in (opts["attrs"] if opts else []):
        v = slot.value
        if hasattr(v, "data") and v["header"]["type"] == TCA_BPF_ID:
            return int.from_bytes(v.data[v.offset + 4:v.offset + 8], "little")
    return None


def port_programs(ipr, ifindex: int) -> dict[str, list[tuple[str, int]]]:
    """What runs on a port, per direction, in the kernel's order: ("tcx" | "clsact", program id) pairs,
    tcx links first. ``ipr`` (and the calling thread) must be in the port's namespace."""
    out: dict[str, list[tuple[str, int]]] = {}
    for d in DIRECTIONS:
        ids = [("tcx", i) for i in bpfmaps.tcx_program_ids(ifindex, TCX_ATTACH[d])] if bpfmaps.tcx_supported() else []
        for f in ipr.get_filters(ifindex, parent=CLSACT_PARENT_ID[d]):
            pid = _bpf_filter_id(f)
            if pid is not None:
                ids.append(("clsact", pid))
        out[d] = ids
    return out


def port_program_names(ns: str, ifname: str) -> dict[str, list[str]]:
    """Per direction, the names of the programs on port ``ifname`` of namespace ``ns`` in the order
    they run, each as "<hook>:<name>" (e.g. "tcx:fp_ingress", "clsact:fp_count_in")."""
    from netns_testbed.nsutil import in_netns, iproute

    with iproute(ns) as ipr, in_netns(ns):
        idx = ipr.link_lookup(ifname=ifname)[0]
        progs = port_programs(ipr, idx)
    names = bpfmaps.loaded_programs()
    return {d: [f"{h}:{names.get(i, '?')}" for h, i in ids] for d, ids in progs.items()}
