"""Silent link faults: parse, set, change, show and clear them on a live testbed.

Text form (CLI and experiment specs)::

    LINK:KIND[=RATE][,MOD=VALUE...]
    leaf1->spine2:drop=0.01            drop 1% of packets
    spine0->leaf3:corrupt=0.015        damage the IPv4 header of 1.5% (dropped downstream)
    h3->leaf1:blackhole                drop everything
    leaf1->spine2:partial=0.5          blackhole half of the flows (by 5-tuple hash)
    leaf1->spine2:drop=0.02,src=h1,dst=h6   only packets h1 -> h6
    leaf1->spine2:blackhole,flap=1/2   on 1 s, off 2 s, repeating

Faults are applied by the BPF injector in the switch datapath, on the wire
between the upstream counter and the downstream one (see ``Fabric.fault_site``).
Where the kernel has ``sch_netem``, plain drops and blackholes can instead use
netem on the upstream node's port (``backend="netem"``): its root qdisc runs
after the upstream switch's egress counter, so the semantics are the same. The
BPF injector stays the default: it is exact, present on every kernel with BPF,
and does corruption of the header, partial and flapping faults, which netem
cannot express.
"""
from __future__ import annotations

import ipaddress
import math
import subprocess
import time
from dataclasses import dataclass
from enum import Enum

from netns_testbed.errors import EnvironmentProblem, SpecError
from netns_testbed import datapath as dp
from netns_testbed.state import Testbed
from netns_testbed.topo import Fabric, Link, node_kind

class FaultKind(str, Enum):
    """What a fault does to the packets it selects (a ``str`` enum: equal to its name)."""

    DROP = "drop"            # drop a share of packets
    CORRUPT = "corrupt"      # damage the IPv4 header of a share (dropped downstream)
    BLACKHOLE = "blackhole"  # drop every packet
    PARTIAL = "partial"      # drop every packet of a share of the flows

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in FaultKind)
BACKENDS = ("bpf", "netem")


@dataclass(frozen=True)
class Endpoint:
    """A fault's ``src=`` or ``dst=``: as written (a host, a leaf or a CIDR) and as the network it is."""

    text: str
    network: ipaddress.IPv4Network

    def to_dict(self) -> dict:
        return {"text": self.text, "network": str(self.network)}

    @classmethod
    def from_dict(cls, d: dict) -> "Endpoint":
        return cls(d["text"], ipaddress.IPv4Network(d["network"]))


@dataclass(frozen=True)
class FaultSpec:
    """One fault on one directed link, parsed once (:func:`parse_fault`) and passed on as is: the
    CLI, the experiment spec, ``apply``/``clear``/``listing`` and the state file share it."""

    link: Link
    kind: FaultKind
    rate: float = 1.0
    src: Endpoint | None = None   # only packets from there
    dst: Endpoint | None = None
    flows: float = 1.0       # fraction of flows (by hash) affected
    flap_on_s: float = 0.0   # flapping: on for this long ...
    flap_off_s: float = 0.0  # ... then off for this long

    def describe(self) -> str:
        text = f"{self.link.name}:{self.kind}"
        if self.kind in (FaultKind.DROP, FaultKind.CORRUPT):
            text += f"={self.rate:g}"
        elif self.kind is FaultKind.PARTIAL:
            text += f"={self.flows:g}"
        mods = []
        if self.src:
            mods.append(f"src={self.src.text}")
        if self.dst:
            mods.append(f"dst={self.dst.text}")
        if self.kind is not FaultKind.PARTIAL and self.flows < 1.0:
            mods.append(f"flows={self.flows:g}")
        if self.flap_on_s:
            mods.append(f"flap={self.flap_on_s:g}/{self.flap_off_s:g}")
        return ",".join([text, *mods])

    @property
    def effective_rate(self) -> float:
        """Probability that a packet on the link is hit (over selected traffic)."""
        return 1.0 if self.kind in (FaultKind.BLACKHOLE, FaultKind.PARTIAL) else self.rate

    def to_dict(self) -> dict:
        """JSON form (state file, reports): the link by name, endpoints with their resolved networks."""
        return {"link": self.link.name, "kind": self.kind.value, "rate": self.rate,
                "src": self.src.to_dict() if self.src else None, "dst": self.dst.to_dict() if self.dst else None,
                "flows": self.flows, "flap_on_s": self.flap_on_s, "flap_off_s": self.flap_off_s}

    @classmethod
    def from_dict(cls, d: dict) -> "FaultSpec":
        a, _, b = d["link"].partition("->")
        ends = {k: Endpoint.from_dict(d[k]) if d.get(k) else None for k in ("src", "dst")}
        return cls(Link(a, b), FaultKind(d["kind"]), float(d["rate"]), ends["src"], ends["dst"], float(d["flows"]),
                   float(d["flap_on_s"]), float(d["flap_off_s"]))


def _rate(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"bad {what} {text!r}: must be a number in [0, 1]") from None
    if not (0.0 <= v <= 1.0) or math.isnan(v):
        raise SpecError(f"bad {what} {v:g}: must be in [0, 1] (e.g. 0.01 for 1%)")
    return v


def _endpoint(fabric: Fabric, text: str) -> Endpoint:
    """A node name (host -> /32, leaf -> its host /16) or a CIDR."""
    if fabric.has_node(text):
        kind = node_kind(text)
        if kind == "h":
            return Endpoint(text, ipaddress.IPv4Network(f"{fabric.host_ip(text)}/32"))
        if kind == "leaf":
            return Endpoint(text, Fabric.leaf_subnet(text))
        raise SpecError(f"bad endpoint {text!r}: use a host, a leaf or a CIDR (spines send no traffic)")
    try:
        return Endpoint(text, ipaddress.IPv4Network(text, strict=False))
    except ValueError:
        raise SpecError(f"bad endpoint {text!r}: use a host (h3), a leaf (leaf1) or a CIDR (10.2.0.0/16)") from None


def parse_fault(fabric: Fabric, text: str) -> FaultSpec:
    """Parse ``LINK:KIND[=RATE][,MOD=V...]`` against the fabric (unknown links are errors)."""
    link_text, sep, rest = (text or "").partition(":")
    if not sep or not rest:
        raise SpecError(f"bad fault {text!r}: write LINK:KIND[=RATE], e.g. leaf1->spine2:drop=0.01")
    link = fabric.parse_link(link_text)
    head, *mods = rest.split(",")
    kind_text, _, value = head.partition("=")
    try:
        kind = FaultKind(kind_text.strip())
    except ValueError:
        raise SpecError(f"unknown fault kind {kind_text.strip()!r} in {text!r}: choose one of {', '.join(KINDS)}") from None
    args: dict = {"link": link, "kind": kind}
    if kind in (FaultKind.DROP, FaultKind.CORRUPT):
        if not value:
            raise SpecError(f"fault {text!r} needs a rate: {kind}=P with P in [0, 1]")
        args["rate"] = _rate(value, f"{kind} rate")
    elif kind is FaultKind.PARTIAL:
        args["flows"] = _rate(value or "0.5", "partial flow fraction")
    elif value:
        raise SpecError(f"fault kind {kind} takes no rate (got {value!r}); use drop=P for a rate")
    for mod in mods:
        key, _, val = mod.partition("=")
        key = key.strip()
        if key in ("src", "dst"):
            if not val:
                raise SpecError(f"{key}= needs a host, leaf or CIDR in fault {text!r}")
            args[key] = _endpoint(fabric, val.strip())
        elif key == "flows":
            args["flows"] = _rate(val, "flow fraction")
        elif key == "flap":
            on, _, off = val.partition("/")
            try:
                args["flap_on_s"], args["flap_off_s"] = float(on), float(off)
            except ValueError:
                raise SpecError(f"bad flap {val!r}: write flap=ON/OFF in seconds, e.g. flap=1/2") from None
            if args["flap_on_s"] <= 0 or args["flap_off_s"] < 0:
                raise SpecError(f"bad flap {val!r}: ON must be > 0 and OFF >= 0 seconds")
        else:
            raise SpecError(f"unknown fault modifier {key!r} in {text!r}: use src=, dst=, flows= or flap=")
    return FaultSpec(**args)


def kernel_record(spec: FaultSpec) -> dp.Fault:
    """The BPF injector's record of a fault (the ``faults`` map's fp_fault)."""
    kind = "blackhole" if spec.kind is FaultKind.PARTIAL else spec.kind.value
    period = spec.flap_on_s + spec.flap_off_s
    return dp.fault_struct(kind, spec.effective_rate,
                           src=str(spec.src.network) if spec.src else None,
                           dst=str(spec.dst.network) if spec.dst else None,
                           flow_frac=spec.flows, period_s=period, on_s=spec.flap_on_s)


def _netem_argv(tb: Testbed, link, action: str, rate: float | None = None) -> list[str]:
    """tc argv for netem on the upstream node's port of ``link`` (no shell)."""
    port = tb.fabric.port_to(link.src, link.dst)
    argv = ["tc", "-n", tb.ns(link.src), "qdisc", action, "dev", port.ifname, "root"]
    if rate is not None:
        argv += ["netem", "loss", f"{100 * rate:.6f}%"]
    return argv


def _apply_netem(tb: Testbed, link, spec: FaultSpec) -> None:
    if spec.kind not in (FaultKind.DROP, FaultKind.BLACKHOLE) or spec.src or spec.dst or spec.flows < 1.0 or spec.flap_on_s:
        raise SpecError(f"netem backend does plain drop/blackhole only, not {spec.describe()!r}: use --backend bpf")
    r = subprocess.run(_netem_argv(tb, link, "replace", spec.effective_rate), capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["tc failed"])[-1]
        if "unknown" in msg.lower():
            raise EnvironmentProblem(f"this kernel has no sch_netem ({msg}): use the default --backend bpf")
        raise EnvironmentProblem(f"tc netem on {link.name} failed: {msg}")


def apply(tb: Testbed, spec: FaultSpec, backend: str = "bpf") -> bool:
    """Set (or change) the fault on its link; returns True if it replaced one."""
    if backend not in BACKENDS:
        raise SpecError(f"unknown fault backend {backend!r}: choose bpf or netem")
    link = spec.link
    if link not in tb.fabric.links():
        raise SpecError(f"no link {link.name} in testbed {tb.prefix!r}: the fault was parsed for another fabric")
    site = tb.fabric.fault_site(link)
    with tb.locked():
        old = tb.state.faults.get(link.name)
        if old and old.get("backend", "bpf") != backend:
            raise SpecError(f"{link.name} has a {old.get('backend', 'bpf')} fault: clear it before using {backend}")
        if backend == "netem":
            _apply_netem(tb, link, spec)
        else:
            m = tb.maps(site.switch)
            try:
                m.set_fault(site.port, site.hook, kernel_record(spec))
            finally:
                m.close()
        replaced = link.name in tb.state.faults
        tb.state.faults[link.name] = {**spec.to_dict(), "since": time.time(), "backend": backend}
        tb.save()
    return replaced


def clear(tb: Testbed, link_text: str | None = None) -> list[str]:
    """Clear the fault on one link (``a->b`` or ``a<->b``), or all faults; returns the links cleared."""
    with tb.locked():
        links = tb.fabric.parse_links(link_text) if link_text else [tb.fabric.parse_link(n) for n in tb.state.faults]
        cleared = []
        for link in links:
            rec = tb.state.faults.get(link.name) or {}
            if rec.get("backend") == "netem":
                subprocess.run(_netem_argv(tb, link, "del"), capture_output=True)
            else:
                site = tb.fabric.fault_site(link)
                m = tb.maps(site.switch)
                try:
                    m.clear_fault(site.port, site.hook)
                finally:
                    m.close()
            if tb.state.faults.pop(link.name, None) is not None:
                cleared.append(link.name)
        tb.save()
    return cleared


def listing(tb: Testbed) -> list[dict]:
    """Active faults with the injector's own counts (packets selected / hit)."""
    out = []
    for name, rec in sorted(tb.state.faults.items()):
        link = tb.fabric.parse_link(name)
        site = tb.fabric.fault_site(link)
        m = tb.maps(site.switch)
        try:
            st = m.fault_stats(site.port, site.hook)
        finally:
            m.close()
        spec = FaultSpec.from_dict(rec)
        netem = rec.get("backend") == "netem"
        out.append({"link": name, "fault": spec.describe(), "kind": spec.kind, "rate": spec.effective_rate,
                    "since": rec.get("since"), "backend": rec.get("backend", "bpf"),
                    "at": f"netem on {link.src} {tb.fabric.port_to(link.src, link.dst).ifname}" if netem
                    else f"{site.switch} port {site.port} {site.hook}",
                    "matched": None if netem else st.matched, "hit": None if netem else st.hit})
    return out
