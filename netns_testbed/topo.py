"""The fabric data model: one description of the leaf-spine fabric for every part.

The testbed builds it, the agent reads it (expected spray shares, which port faces
which neighbour), and the analysis names links from it. Nothing here touches the
kernel, so it is testable without root (Mininet's "describe, then build").

Naming contract (users, alerts and reports rely on it)::

    hosts   h0 .. h{N-1}      host i sits on leaf i // hosts_per_leaf
    leaves  leaf0 .. leaf{L-1}
    spines  spine0 .. spine{S-1}
    directed links  "leaf1->spine2", "spine2->leaf1", "h3->leaf1", "leaf1->h3"
    both directions "leaf1<->spine2"

Port numbering (the counters' ``port`` index, same as the recorded pulse traces)::

    leaf L:  0..S-1 = uplink to spine k;  S..S+H-1 = port to its host j
    spine K: 0..L-1 = port to leaf l
    host:    0 = eth0

Addresses: host j of leaf L is 10.(L+1).j.2/24 (leaf side .1), so a packet's source
leaf is readable from its source address; the leaf L - spine K link is
10.(100+L).K.0/30 (leaf .1, spine .2).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable

from netns_testbed.errors import SpecError, StateError

MAX_LEAVES = 32
MAX_SPINES = 64
MAX_HOSTS_PER_LEAF = 16
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
NODE_RE = re.compile(r"^(h|leaf|spine)(\d+)$")


class SprayMode(str, Enum):
    """How a leaf picks the uplink of each packet (what the datapath implements).

    A ``str`` enum, written by its value in files and flags; parsed once where it comes in (argparse
    through :func:`flowpulse.argtypes.choice`, files through :meth:`parse`) and carried as the member
    to the datapath's code (``datapath.SPRAY_CODES``, checked against ``bpf/switch.h``), the detector's
    noise model (``agent.detector.checks.SPRAY_NOISE``) and the counter model's split
    (``analysis.model.SPLITS``). Adding a mode: a member here (value and help), its ``FP_SPRAY_*``
    constant and code, its spray in ``switch.c``, its noise entry and its split;
    tests/test_contract.py and tests/test_vocabulary.py fail until each is there.
    """

    RANDOM = "random", "uniform random uplink per packet"                      # a multinomial split
    RR = "rr", "round-robin, one rotation per CPU"                              # shared by all destinations
    RRDST = "rrdst", "round-robin, one rotation per (CPU, destination leaf): exact per-destination split"

    def __new__(cls, value: str, help: str = "") -> "SprayMode":
        member = str.__new__(cls, value)
        member._value_ = value
        member.help = help
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: "str | SprayMode") -> "SprayMode":
        try:
            return cls(text)
        except ValueError:
            raise SpecError(f"unknown spray mode {text!r}: choose one of {', '.join(m.value for m in cls)}") from None

    @classmethod
    def described(cls) -> str:
        """Every mode with its help, one per line (for --help epilogs)."""
        return "\n".join(f"  {m.value:7s} {m.help}" for m in cls)


class Hook(str, Enum):
    """How a switch's programs are attached to its ports: tcx links (kernel 6.6+) or tc clsact filters
    (netns_testbed.hooks attaches them)."""

    TCX = "tcx"
    CLSACT = "clsact"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """As ``fabric status`` shows it."""
        return "tcx" if self is Hook.TCX else "tc clsact"




def check_prefix(prefix: str) -> str:
    """Validate a testbed prefix: every kernel object of the testbed carries it."""
    if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):   # (match() let "fp\n" through)
        raise SpecError(
            f"bad prefix {prefix!r}: use 1-8 lowercase letters/digits starting with a letter, e.g. --prefix fp"
        )
    return prefix


@dataclass(frozen=True)
class FabricSpec:
    """Shape of a 2-level fat-tree: what the user asks for."""

    leaves: int = 4
    spines: int = 4
    hosts_per_leaf: int = 2
    mtu: int = 1500

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("leaves", self.leaves, 1, MAX_LEAVES),
            ("spines", self.spines, 1, MAX_SPINES),
            ("hosts-per-leaf", self.hosts_per_leaf, 1, MAX_HOSTS_PER_LEAF),
            ("mtu", self.mtu, 576, 9000),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise SpecError(f"bad {name} {value!r}: must be an integer in [{low}, {high}]")

    @classmethod
    def from_dict(cls, data: dict) -> "FabricSpec":
        if not isinstance(data, dict):
            raise SpecError(f"bad fabric spec {data!r}: expected a mapping with leaves/spines/hosts_per_leaf/mtu")
        known = {"leaves", "spines", "hosts_per_leaf", "mtu"}
        unknown = set(data) - known
        if unknown:
            raise SpecError(f"unknown fabric field(s) {sorted(unknown)}: allowed are {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        return {"leaves": self.leaves, "spines": self.spines, "hosts_per_leaf": self.hosts_per_leaf, "mtu": self.mtu}


@dataclass(frozen=True)
class Port:
    """One interface of a node. ``ifname`` is the neighbour's node name (``eth0`` on hosts)."""

    node: str
    index: int
    ifname: str
    peer: str
    peer_index: int
    address: ipaddress.IPv4Interface


@dataclass(frozen=True)
class Link:
    """A directed link ``src->dst``."""

    src: str
    dst: str

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    def __str__(self) -> str:
        return self.name

    @property
    def reverse(self) -> "Link":
        return Link(self.dst, self.src)


@dataclass(frozen=True)
class SprayChange:
    """A change of what the leaves spray over (a drain, a restore, an uplink's weight: netns_testbed.drain): every
    leaf's tables switched between monotonic times ``t0_ns`` and ``t1_ns`` (None while switching), and
    ``out_of_service`` is the whole set out of service after it. Detectors take the new shares and do
    not judge a pulse that crosses the window (agent.detector.SwitchDetector.reshare)."""

    epoch: int
    action: str                       # "drain", "restore" or "weight"
    links: tuple[Link, ...]           # what this change drained, restored or weighed anew
    out_of_service: tuple[Link, ...]
    t0_ns: int
    t1_ns: int | None
    weights: tuple[tuple[str, float], ...] = ()   # every uplink weight after it (leafL->spineK -> w; default 1)


@dataclass(frozen=True)
class FaultSite:
    """Where a fault on a directed link is applied in the datapath.

    Faults act *on the wire*: after the upstream switch counted the packet and
    before the downstream switch counts it. When the upstream node is a switch
    the fault runs last on its egress hook, after its count; when it is a host
    (no program there) it runs first on the leaf's ingress hook, before the count.

    Upstream egress, not downstream ingress, so that a counting program someone
    else attaches first on a port (``flowpulse agent --site`` on a testbed) sees
    what the testbed's own counters see: any tc program that runs before ours at
    ingress would count a packet an ingress fault then drops.
    """

    switch: str
    port: int
    hook: str  # "ingress" (before counting) or "egress" (after counting)


def node_kind(name: str) -> str:
    m = NODE_RE.match(name)
    if not m:
        raise SpecError(f"bad node name {name!r}: expected h<N>, leaf<N> or spine<N>")
    return m.group(1)


def node_num(name: str) -> int:
    node_kind(name)
    return int(NODE_RE.match(name).group(2))  # type: ignore[union-attr]


@dataclass
class Fabric:
    """The built-out model: nodes, ports, links and spray groups of one spec."""

    spec: FabricSpec
    ports: dict[str, list[Port]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = self._make_ports()

    # -- nodes -------------------------------------------------------------
    @property
    def leaves(self) -> list[str]:
        return [f"leaf{i}" for i in range(self.spec.leaves)]

    @property
    def spines(self) -> list[str]:
        return [f"spine{i}" for i in range(self.spec.spines)]

    @property
    def hosts(self) -> list[str]:
        return [f"h{i}" for i in range(self.spec.leaves * self.spec.hosts_per_leaf)]

    @property
    def switches(self) -> list[str]:
        return self.leaves + self.spines

    @property
    def nodes(self) -> list[str]:
        return self.hosts + self.switches

    def has_node(self, name: str) -> bool:
        m = NODE_RE.match(name)
        if not m:
            return False
        kind, num = m.group(1), int(m.group(2))
        limit = {"h": len(self.hosts), "leaf": self.spec.leaves, "spine": self.spec.spines}[kind]
        return num < limit and str(num) == m.group(2)

    def host_leaf(self, host: str) -> str:
        return f"leaf{node_num(host) // self.spec.hosts_per_leaf}"

    def host_slot(self, host: str) -> int:
        return node_num(host) % self.spec.hosts_per_leaf

    def leaf_hosts(self, leaf: str) -> list[str]:
        n = node_num(leaf)
        h = self.spec.hosts_per_leaf
        return [f"h{n * h + j}" for j in range(h)]

    def host_ip(self, host: str) -> str:
        return str(self._host_iface(host).ip)

    def _host_iface(self, host: str) -> ipaddress.IPv4Interface:
        leaf = node_num(host) // self.spec.hosts_per_leaf
        return ipaddress.IPv4Interface(f"10.{leaf + 1}.{self.host_slot(host)}.2/24")

    @staticmethod
    def leaf_subnet(leaf: str) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{node_num(leaf) + 1}.0.0/16")

    def source_leaf_of(self, address: str) -> str | None:
        """The leaf whose host subnet holds ``address`` (what the datapath's ``src`` field encodes)."""
        ip = ipaddress.IPv4Address(address)
        octets = ip.packed
        if octets[0] == 10 and 1 <= octets[1] <= self.spec.leaves:
            return f"leaf{octets[1] - 1}"
        return None

    # -- ports -------------------------------------------------------------
    def _make_ports(self) -> dict[str, list[Port]]:
        s = self.spec.spines
        ports: dict[str, list[Port]] = {n: [] for n in self.nodes}
        for li, leaf in enumerate(self.leaves):
            for k, spine in enumerate(self.spines):
                ports[leaf].append(Port(leaf, k, spine, spine, li, ipaddress.IPv4Interface(f"10.{100 + li}.{k}.1/30")))
            for j, host in enumerate(self.leaf_hosts(leaf)):
                ports[leaf].append(Port(leaf, s + j, host, host, 0, ipaddress.IPv4Interface(f"10.{li + 1}.{j}.1/24")))
                ports[host].append(Port(host, 0, "eth0", leaf, s + j, self._host_iface(host)))
        for k, spine in enumerate(self.spines):
            for li, leaf in enumerate(self.leaves):
                ports[spine].append(Port(spine, li, leaf, leaf, k, ipaddress.IPv4Interface(f"10.{100 + li}.{k}.2/30")))
        return ports

    def port(self, node: str, index: int) -> Port:
        return self.ports[node][index]

    def port_to(self, node: str, peer: str) -> Port:
        for p in self.ports[node]:
            if p.peer == peer:
                return p
        raise SpecError(f"{node} has no port to {peer}")

    def uplinks(self, leaf: str) -> list[Port]:
        return self.ports[leaf][: self.spec.spines]

    # -- links -------------------------------------------------------------
    def links(self) -> list[Link]:
        """All directed links, leaf-spine first."""
        out: list[Link] = []
        for leaf in self.leaves:
            for spine in self.spines:
                out += [Link(leaf, spine), Link(spine, leaf)]
        for host in self.hosts:
            leaf = self.host_leaf(host)
            out += [Link(host, leaf), Link(leaf, host)]
        return out

    def fabric_links(self) -> list[Link]:
        """The sprayed (leaf<->spine) directed links."""
        return [l for l in self.links() if "h" not in (node_kind(l.src), node_kind(l.dst))]

    def parse_links(self, text: str) -> list[Link]:
        """Parse ``a->b`` (one direction) or ``a<->b`` (both); unknown names are a SpecError."""
        text = (text or "").strip()
        both = "<->" in text
        parts = text.split("<->") if both else text.split("->")
        if len(parts) != 2 or not all(parts):
            raise SpecError(f"bad link {text!r}: write it as NODE->NODE or NODE<->NODE, e.g. leaf1->spine2")
        a, b = (p.strip() for p in parts)
        for n in (a, b):
            if not self.has_node(n):
                raise SpecError(
                    f"unknown node {n!r} in link {text!r}: this fabric has h0..h{len(self.hosts) - 1}, "
                    f"leaf0..leaf{self.spec.leaves - 1}, spine0..spine{self.spec.spines - 1}"
                )
        link = Link(a, b)
        if link not in set(self.links()):
            raise SpecError(f"no link {a}->{b} in this fabric: links join a leaf to a spine or a host to its leaf")
        return [link, link.reverse] if both else [link]

    def parse_link_list(self, texts: Iterable[str] | None) -> list[Link]:
        """Every link of several texts (``a->b`` or ``a<->b`` each), in order."""
        return [link for text in texts or () for link in self.parse_links(str(text))]

    def parse_link(self, text: str) -> Link:
        links = self.parse_links(text)
        if len(links) != 1:
            raise SpecError(f"link {text!r} names both directions; name one, e.g. {links[0].name}")
        return links[0]

    def fault_site(self, link: Link) -> FaultSite:
        if node_kind(link.src) == "h":
            return FaultSite(link.dst, self.port_to(link.dst, link.src).index, "ingress")
        return FaultSite(link.src, self.port_to(link.src, link.dst).index, "egress")

    def link_of_port(self, switch: str, index: int, direction: str) -> Link:
        """The directed link a switch port's counter measures (``in``: peer->switch)."""
        p = self.port(switch, index)
        return Link(p.peer, switch) if direction == "in" else Link(switch, p.peer)

    # -- spraying ----------------------------------------------------------
    def spray_shares(
        self,
        src_leaf: str,
        dst_leaf: str,
        weights: dict[str, float] | None = None,
        out_of_service: Iterable[Link] = (),
    ) -> dict[str, float]:
        """Expected fraction of ``src_leaf``'s traffic to ``dst_leaf`` on each spine.

        A spine is usable when both ``src_leaf->spine`` and ``spine->dst_leaf`` are
        in service; ``weights`` maps link names ``leafL->spineK`` to relative weights
        (default 1). This is what the datapath's spray tables implement and what the
        agent's analytic model expects.
        """
        oos = {l.name for l in out_of_service}
        weights = weights or {}
        raw: dict[str, float] = {}
        for spine in self.spines:
            up, down = f"{src_leaf}->{spine}", f"{spine}->{dst_leaf}"
            if up in oos or down in oos:
                continue
            w = float(weights.get(up, 1.0))
            if w > 0:
                raw[spine] = w
        total = sum(raw.values())
        return {s: w / total for s, w in raw.items()} if total else {}

    # -- draining ----------------------------------------------------------
    def check_drain(self, out_of_service: Iterable[Link], links: Iterable[Link], min_spines: int = 1) -> None:
        """Refuse (one line) taking ``links`` out of service on top of ``out_of_service``: only leaf-spine
        links can be drained, and every leaf must keep at least ``min_spines`` spines towards every
        other leaf (a drained ``spineK->leafL`` takes spine K from every leaf's traffic to leaf L)."""
        if min_spines < 1:
            raise SpecError(f"--min-spines {min_spines}: a leaf needs at least one spine to each other leaf")
        for link in links:
            kinds = {node_kind(link.src), node_kind(link.dst)}
            if kinds != {"leaf", "spine"}:
                raise SpecError(f"{link.name} is a host link: only leaf-spine links can be drained "
                                "(a host has no other way in or out)")
        after = {l.name for l in out_of_service} | {l.name for l in links}
        drained = self.links_named(after)
        for a in self.leaves:
            for b in self.leaves:
                if a == b:
                    continue
                n = len(self.spray_shares(a, b, None, drained))
                if n < min_spines:
                    what = ", ".join(sorted({l.name for l in links}))
                    lower = ", or lower --min-spines" if min_spines > 1 else ""
                    raise StateError(f"draining {what} would leave {a}'s traffic to {b} {n} spine(s), under the "
                                     f"floor of {min_spines}: restore a link first{lower}")

    def links_named(self, names: Iterable[str]) -> list[Link]:
        return [self.parse_link(n) for n in sorted(names)]

    # -- serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "Fabric":
        return cls(FabricSpec.from_dict(data["spec"]))


def namespace(prefix: str, node: str) -> str:
    """Name of a node's network namespace: ``<prefix>-<node>``."""
    return f"{prefix}-{node}"


def parse_namespace(name: str) -> tuple[str, str] | None:
    """Inverse of :func:`namespace`, for cleanup that reads the kernel, not saved state."""
    prefix, sep, node = name.partition("-")
    if not sep or not PREFIX_RE.fullmatch(prefix) or not NODE_RE.match(node):
        return None
    return prefix, node


_LARGEST: list[Fabric] = []


def largest_fabric() -> Fabric:
    """The largest fabric FabricSpec allows: a link, link list or fault spec that does not parse against it
    is malformed whatever testbed it is for, so commands check their arguments against it before they
    look for the testbed (a typo is told as a typo, not as "no testbed")."""
    if not _LARGEST:
        _LARGEST.append(Fabric(FabricSpec(MAX_LEAVES, MAX_SPINES, MAX_HOSTS_PER_LEAF)))
    return _LARGEST[0]
