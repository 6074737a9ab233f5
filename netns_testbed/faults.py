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
Where the kernel has ``sch_netem``, drops, blackholes, corruption and delay can
instead use netem (``Backend.NETEM``): a root qdisc on the upstream node's port.
The upstream switch's egress program runs before any qdisc (``tc`` egress is
called from ``__dev_queue_xmit`` ahead of the enqueue), so netem acts after the
upstream counter and before the downstream one, like the BPF injector. What
differs (docs/concepts/datapath.md, "Fault backends"):

* corruption: the BPF injector damages the IPv4 header of a share of packets,
  which the next hop drops as header errors; netem flips one random bit of the
  frame's linear part (after completing a pending checksum), so a share
  ``20 / frame length`` of the corrupted frames become header errors at the next
  hop, a flip in the Ethernet header may change the frame's type or address,
  and the rest reach the receiving host and fail its transport checksum there:
  a loss the fabric's counters cannot see until the sender resends;
* netem selects no traffic: no ``src=``, ``dst=``, ``flows=``, ``partial`` or
  ``flap=`` (the BPF injector has them all);
* delay exists only in netem (``delay=MS``: the BPF datapath has no queue to hold
  packets in).

The BPF injector stays the default: it is exact, present on every kernel with
BPF, and counts what it selects and hits; netem's own statistics (packets sent
and dropped by the qdisc) are what ``fault list`` shows for it.
"""
from __future__ import annotations

import ipaddress
import json
import math
import os
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
    DELAY = "delay"          # hold every packet for a while (netem only)

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in FaultKind)


class Backend(str, Enum):
    """What injects a fault: the datapath's BPF injector or the kernel's netem qdisc."""

    BPF = "bpf"
    NETEM = "netem"

    def __str__(self) -> str:
        return self.value


BACKENDS = tuple(b.value for b in Backend)
MAX_DELAY_S = 10.0


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
    delay_s: float = 0.0     # delay: how long every packet is held

    def describe(self) -> str:
        text = f"{self.link.name}:{self.kind}"
        if self.kind in (FaultKind.DROP, FaultKind.CORRUPT):
            text += f"={self.rate:g}"
        elif self.kind is FaultKind.PARTIAL:
            text += f"={self.flows:g}"
        elif self.kind is FaultKind.DELAY:
            text += f"={self.delay_s * 1000:g}ms"
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
        if self.kind is FaultKind.DELAY:
            return 0.0
        return 1.0 if self.kind in (FaultKind.BLACKHOLE, FaultKind.PARTIAL) else self.rate

    def to_dict(self) -> dict:
        """JSON form (state file, reports): the link by name, endpoints with their resolved networks."""
        return {"link": self.link.name, "kind": self.kind.value, "rate": self.rate,
                "src": self.src.to_dict() if self.src else None, "dst": self.dst.to_dict() if self.dst else None,
                "flows": self.flows, "flap_on_s": self.flap_on_s, "flap_off_s": self.flap_off_s,
                "delay_s": self.delay_s}

    @classmethod
    def from_dict(cls, d: dict) -> "FaultSpec":
        a, _, b = d["link"].partition("->")
        ends = {k: Endpoint.from_dict(d[k]) if d.get(k) else None for k in ("src", "dst")}
        return cls(Link(a, b), FaultKind(d["kind"]), float(d["rate"]), ends["src"], ends["dst"], float(d["flows"]),
                   float(d["flap_on_s"]), float(d["flap_off_s"]), float(d.get("delay_s", 0.0)))


def _rate(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"bad {what} {text!r}: must be a number in [0, 1]") from None
    if not (0.0 <= v <= 1.0) or math.isnan(v):
        raise SpecError(f"bad {what} {v:g}: must be in [0, 1] (e.g. 0.01 for 1%)")
    return v


def _delay(text: str) -> float:
    """``5ms``, ``0.5ms``, ``1s`` or a bare number of milliseconds, in seconds."""
    t = text.strip().lower()
    scale = 1.0 if t.endswith("s") and not t.endswith("ms") else 1e-3
    num = t[:-2] if t.endswith("ms") else t[:-1] if t.endswith("s") else t
    try:
        v = float(num) * scale
    except ValueError:
        raise SpecError(f"bad delay {text!r}: write delay=MS, e.g. delay=5ms") from None
    if not (0.0 < v <= MAX_DELAY_S) or math.isnan(v):
        raise SpecError(f"bad delay {text!r}: must be above 0 and at most {MAX_DELAY_S:g} s")
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
    elif kind is FaultKind.DELAY:
        if not value:
            raise SpecError(f"fault {text!r} needs a time: delay=MS, e.g. delay=5ms")
        args["delay_s"] = _delay(value)
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


def check_backend(spec: FaultSpec, backend: Backend) -> None:
    """Refuse, before anything is touched, a fault the backend cannot express (see the module docstring)."""
    if backend is Backend.BPF and spec.kind is FaultKind.DELAY:
        raise SpecError(f"the BPF injector cannot delay ({spec.describe()!r}): use --backend netem "
                        "on a kernel with sch_netem")
    if backend is Backend.NETEM:
        if spec.kind is FaultKind.PARTIAL or spec.src or spec.dst or spec.flows < 1.0 or spec.flap_on_s:
            raise SpecError(f"netem selects no traffic and does not flap ({spec.describe()!r}): "
                            "netem does drop, blackhole, corrupt and delay on a whole link; use --backend bpf")


# What the BPF injector does to a packet a fault selects, per kind (FP_FAULT_*, checked against bpf/switch.h
# by the contract); the share it selects is the spec's effective_rate (a blackhole and a partial fault: all
# of it). Delay is netem's alone (check_backend refuses it first).
INJECTOR_ACTION = {FaultKind.DROP: dp.FAULT_DROP, FaultKind.BLACKHOLE: dp.FAULT_DROP, FaultKind.PARTIAL: dp.FAULT_DROP,
                   FaultKind.CORRUPT: dp.FAULT_CORRUPT}


def kernel_record(spec: FaultSpec) -> dp.Fault:
    """The BPF injector's record of a fault (the ``faults`` map's fp_fault), from the parsed spec."""
    check_backend(spec, Backend.BPF)
    return dp.fault_struct(INJECTOR_ACTION[spec.kind], spec.effective_rate,
                           src=spec.src.network if spec.src else None, dst=spec.dst.network if spec.dst else None,
                           flow_frac=spec.flows, period_s=spec.flap_on_s + spec.flap_off_s, on_s=spec.flap_on_s)


def netem_params(spec: FaultSpec) -> list[str]:
    """The netem qdisc's parameters for a fault (tc's words, no shell)."""
    check_backend(spec, Backend.NETEM)
    if spec.kind is FaultKind.DELAY:
        return ["delay", f"{spec.delay_s * 1e6:.0f}us"]
    if spec.kind is FaultKind.CORRUPT:
        return ["corrupt", f"{100 * spec.rate:.6f}%"]
    return ["loss", f"{100 * spec.effective_rate:.6f}%"]


def _netem_argv(tb: Testbed, link: Link, action: str, params: list[str] | None = None, stats: bool = False) -> list[str]:
    """tc argv for netem on the upstream node's port of ``link``."""
    port = tb.fabric.port_to(link.src, link.dst)
    head = ["tc", "-n", tb.ns(link.src)] + (["-s", "-j"] if stats else [])
    argv = head + ["qdisc", action, "dev", port.ifname] + ([] if stats else ["root"])
    if params is not None:
        argv += ["netem", *params]
    return argv


def _apply_netem(tb: Testbed, link: Link, spec: FaultSpec) -> None:
    r = subprocess.run(_netem_argv(tb, link, "replace", netem_params(spec)), capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["tc failed"])[-1]
        if "unknown" in msg.lower():
            raise EnvironmentProblem(f"this kernel has no sch_netem ({msg}): use the default --backend bpf")
        raise EnvironmentProblem(f"tc netem on {link.name} failed: {msg}")


def netem_missing() -> str | None:
    """Why this kernel cannot run netem (None: it can), probed in a scratch namespace of our own."""
    ns = f"fpnetem{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        return "cannot create a namespace to probe it"
    try:
        r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem"], capture_output=True, text=True)
        return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["tc failed"])[-1]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def require_netem() -> None:
    why = netem_missing()
    if why:
        raise EnvironmentProblem(f"this kernel has no sch_netem ({why}): use the default fault backend bpf")


@dataclass(frozen=True)
class NetemStats:
    """A netem qdisc's own counts: packets it passed on and packets it dropped."""

    sent: int
    dropped: int


def netem_stats(tb: Testbed, link: Link) -> NetemStats | None:
    """The statistics of the netem qdisc on ``link``'s upstream port (None: there is none)."""
    r = subprocess.run(_netem_argv(tb, link, "show", stats=True), capture_output=True, text=True)
    try:
        rows = json.loads(r.stdout) if r.returncode == 0 else []
    except ValueError:
        rows = []
    for q in rows:
        if q.get("kind") == "netem" and q.get("root"):
            return NetemStats(int(q.get("packets", 0)), int(q.get("drops", 0)))
    return None


def apply(tb: Testbed, spec: FaultSpec, backend: Backend = Backend.BPF) -> bool:
    """Set (or change) the fault on its link; returns True if it replaced one."""
    backend = Backend(backend)
    check_backend(spec, backend)
    link = spec.link
    if link not in tb.fabric.links():
        raise SpecError(f"no link {link.name} in testbed {tb.prefix!r}: the fault was parsed for another fabric")
    site = tb.fabric.fault_site(link)
    with tb.locked():
        old = tb.state.faults.get(link.name)
        if old and old.get("backend", "bpf") != backend.value:
            raise SpecError(f"{link.name} has a {old.get('backend', 'bpf')} fault: clear it before using {backend}")
        if backend is Backend.NETEM:
            _apply_netem(tb, link, spec)
        else:
            m = tb.maps(site.switch)
            try:
                m.set_fault(site.port, site.hook, kernel_record(spec))
            finally:
                m.close()
        replaced = link.name in tb.state.faults
        tb.state.faults[link.name] = {**spec.to_dict(), "since": time.time(), "backend": backend.value}
        tb.save()
    return replaced


def clear(tb: Testbed, link_text: str | None = None) -> list[str]:
    """Clear the fault on one link (``a->b`` or ``a<->b``), or all faults; returns the links cleared."""
    with tb.locked():
        links = tb.fabric.parse_links(link_text) if link_text else [tb.fabric.parse_link(n) for n in tb.state.faults]
        cleared = []
        for link in links:
            rec = tb.state.faults.get(link.name) or {}
            if rec.get("backend") == Backend.NETEM.value:
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
    """Active faults with the injector's own counts: the BPF injector's packets selected / hit, or the
    netem qdisc's packets through it / dropped (netem does not count what it corrupts or delays)."""
    out = []
    for name, rec in sorted(tb.state.faults.items()):
        link = tb.fabric.parse_link(name)
        spec = FaultSpec.from_dict(rec)
        backend = Backend(rec.get("backend", "bpf"))
        if backend is Backend.NETEM:
            st = netem_stats(tb, link)
            at = f"netem on {link.src} {tb.fabric.port_to(link.src, link.dst).ifname}"
            matched = None if st is None else st.sent + st.dropped
            hit = None if st is None else st.dropped if spec.kind in (FaultKind.DROP, FaultKind.BLACKHOLE) else None
        else:
            site = tb.fabric.fault_site(link)
            m = tb.maps(site.switch)
            try:
                fs = m.fault_stats(site.port, site.hook)
            finally:
                m.close()
            at, matched, hit = f"{site.switch} port {site.port} {site.hook}", fs.matched, fs.hit
        out.append({"link": name, "fault": spec.describe(), "kind": spec.kind, "rate": spec.effective_rate,
                    "since": rec.get("since"), "backend": backend.value, "at": at, "matched": matched, "hit": hit})
    return out
