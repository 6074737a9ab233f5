"""A site file: one switch of a real fabric, as its agent needs to know it.

The agent on a machine that is not the testbed learns everything from one YAML
file (schema: ``agent/site.schema.json``), checked in full before anything is
built: which switch this is in the fabric model, which local interface faces
which neighbour, which address prefixes belong to each source leaf, how the
leaves spray, what is out of service and where state and verdicts go::

    flowpulse_site: 1
    switch: spine2
    fabric: {leaves: 4, spines: 4, hosts_per_leaf: 2}
    counters: ebpf            # ebpf-bcc (compiled here with BCC), or netlink (no BPF; totals only: agent/netlink.py)
    pulse_gap_ms: 50
    spray: rrdst
    ports: {enp1s0: leaf0, enp2s0: leaf1, enp3s0: leaf2, enp4s0: leaf3}
    sources: {leaf0: [10.1.0.0/16], leaf1: [10.2.0.0/16], leaf2: [10.3.0.0/16], leaf3: [10.4.0.0/16]}
    out_of_service: []
    state_dir: /var/lib/flowpulse
    verdict_key: /etc/flowpulse/verdict.key   # the same key file on every agent of the fabric

Nodes keep the model's names (``leafL``, ``spineK``, ``hN``: alerts and incidents
name links with them); interfaces keep the machine's. ``flowpulse fabric
export-site`` writes one per switch of a running testbed, which is how the tests
run the site agent against a real fabric.
"""
from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache
from pathlib import Path

import yaml

from agent.deployment import Deployment
from agent.verdictauth import load_key
from netns_testbed import untrusted
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec, Link, SprayMode, node_kind, node_num

log = logging.getLogger("flowpulse.agent.site")
SCHEMA_PATH = Path(__file__).with_name("site.schema.json")
MAX_PREFIXES = 1024  # the counting program's LPM trie (FP_MAX_PREFIXES in bpf/switch.h)
DEFAULT_STATE_DIR = Path("/var/lib/flowpulse")


class CounterSource(str, Enum):
    """Where the agent's per-pulse counts come from."""

    EBPF = "ebpf"          # agent.counting: exact, per source leaf, pulses cut in the kernel (count.bpf.o, libbpf)
    EBPF_BCC = "ebpf-bcc"  # the same program compiled at start with BCC (needs BCC, LLVM and kernel headers)
    NETLINK = "netlink"    # agent.netlink: interface statistics, no per-source split, pulses cut by a sampler

    @property
    def per_source(self) -> bool:
        """Counts split by source leaf (the eBPF program, whichever toolchain built it)."""
        return self is not CounterSource.NETLINK

    def __str__(self) -> str:
        return self.value


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@dataclass(frozen=True)
class Site:
    path: Path
    switch: str
    fabric: Fabric                     # the model, with this machine's interface names on the switch's ports
    ifnames: tuple[str, ...]           # by port index
    sources: dict[str, tuple[ipaddress.IPv4Network, ...]]  # leaf -> prefixes
    counters: CounterSource
    gap_ms: float
    spray: SprayMode
    weights: dict[str, float]
    out_of_service: tuple[Link, ...]
    degraded: tuple[Link, ...]
    state_dir: Path
    verdict_dir: Path | None           # None: <state_dir>/verdicts
    verdict_key: Path | None = None    # the fabric's verdict key file (agent/verdictauth.py); None: unsigned
    peers: dict[str, str] | None = None    # switch -> its agent's URL (agent/verdictpeers.py); None: verdict files
    peer_ca_file: Path | None = None
    peer_user: str | None = None
    peer_password_file: Path | None = None
    peer_timeout_s: float = 1.0        # a peer slower than this gives no verdict this time
    pinned: tuple[str, ...] = ()       # fields set on the command line: kept when the file is read again

    @property
    def verdicts(self) -> Path:
        return self.verdict_dir or self.state_dir / "verdicts"

    def source_classes(self) -> list[tuple[ipaddress.IPv4Network, int]]:
        """(prefix, source class) for the counting program: class = leaf number + 1."""
        return [(net, node_num(leaf) + 1) for leaf, nets in sorted(self.sources.items()) for net in nets]

    def deployment(self) -> Deployment:
        return Deployment(name=f"site {self.path}", fabric=self.fabric, spray=self.spray, weights=dict(self.weights),
                          out_of_service=self.out_of_service, degraded=self.degraded, state_dir=self.state_dir,
                          verdict_dir=self.verdicts, reload=self.reload,
                          per_source=self.counters.per_source,
                          verdict_key=load_key(self.verdict_key) if self.verdict_key else None,
                          peers=self.peer_access())

    def peer_access(self):
        """How to ask the other switches' agents for their verdicts (None: through verdict files)."""
        if not self.peers:
            return None
        from agent.verdictpeers import PeerAccess

        password = None
        if self.peer_password_file is not None:
            try:
                password = self.peer_password_file.read_text().strip()
            except OSError as e:
                raise SpecError(f"site file {self.path}: peer_password_file {self.peer_password_file}: cannot read "
                                f"it ({e.strerror})") from None
        return PeerAccess(dict(self.peers), self.peer_ca_file, self.peer_user, password, self.peer_timeout_s)

    def reload(self) -> Deployment:
        """SIGHUP: the file read again. What the detector takes (spray, weights, out of service, degraded)
        changes; what the loaded program was built from (switch, ports, sources, gap) needs a restart,
        and a file that no longer validates changes nothing. Either is logged, and the agent goes on."""
        try:
            new = replace(load_site(self.path), **{k: getattr(self, k) for k in self.pinned})
        except SpecError as e:
            log.error("site not reloaded, keeping the running one: %s", e)
            return self.deployment()
        built = ("switch", "ifnames", "sources", "gap_ms", "counters")
        changed = [k for k in built if getattr(new, k) != getattr(self, k)]
        if changed:
            log.error("site not reloaded: %s changed, which the loaded counting program was built from; "
                      "restart the agent to apply it", ", ".join(changed))
            return self.deployment()
        return new.deployment()


def _fail(path: Path, where: str, what: str) -> SpecError:
    return SpecError(f"site file {path}: {where}: {what}")


def read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"site file {path} does not exist: write one (flowpulse fabric export-site shows the form)") from None
    except OSError as e:
        raise SpecError(f"site file {path}: cannot read it ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise _fail(path, where, f"not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise _fail(path, "top level", "expected a mapping (flowpulse_site: 1, switch: ..., ports: ...)")
    for key in ("ports", "sources", "weights"):
        sub = data.get(key)
        if isinstance(sub, dict):
            bad = [k for k in sub if not isinstance(k, str)]
            if bad:
                raise _fail(path, key, f"key {bad[0]!r} is not a string; quote it")
    return data


def check_schema(path: Path, data: dict) -> None:
    """The site file against :data:`SCHEMA_PATH` (and no NaN or infinity anywhere): one line naming the first
    problem."""
    bad = untrusted.problem(SCHEMA_PATH, data)
    if bad is not None:
        where, _, what = bad.partition(": ")
        raise _fail(path, where, what)


def load_site(path: Path | str) -> Site:
    """Read, validate and resolve a site file; one SpecError line naming the first problem."""
    path = Path(path)
    data = read_yaml(path)
    check_schema(path, data)
    return site_from_dict(path, data)


def _prefix(path: Path, leaf: str, text: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(text)
    except ValueError as e:
        raise _fail(path, f"sources.{leaf}", f"bad prefix {text!r} ({e}); write an IPv4 network such as 10.1.0.0/16") from None


def _dir(path: Path, text: str) -> Path:
    p = Path(text)
    return p if p.is_absolute() else (path.parent / p).resolve()


def site_from_dict(path: Path, data: dict) -> Site:
    """The checks a schema cannot make: everything against the fabric model."""
    fabric = Fabric(FabricSpec.from_dict(data["fabric"]))
    switch = data["switch"]
    if switch not in fabric.switches:
        raise _fail(path, "switch", f"{switch} is not in a fabric of {fabric.spec.leaves} leaves and "
                                    f"{fabric.spec.spines} spines")
    # ports: every neighbour of the switch faced by exactly one interface
    neighbours = [p.peer for p in fabric.ports[switch]]
    faced: dict[str, str] = {}
    for ifname, peer in data["ports"].items():
        if peer not in neighbours:
            raise _fail(path, f"ports.{ifname}", f"{peer} is not a neighbour of {switch} (its neighbours: "
                                                 f"{', '.join(neighbours)})")
        if peer in faced:
            raise _fail(path, "ports", f"{peer} is faced by two interfaces ({faced[peer]}, {ifname}); one per link")
        faced[peer] = ifname
    missing = [n for n in neighbours if n not in faced]
    if missing:
        raise _fail(path, "ports", f"no interface faces {', '.join(missing)}: list every port of {switch} "
                                   "(a link out of service too, and put it in out_of_service)")
    ifnames = tuple(faced[p.peer] for p in fabric.ports[switch])
    ports = dict(fabric.ports)
    ports[switch] = [replace(p, ifname=faced[p.peer]) for p in fabric.ports[switch]]
    fabric = Fabric(fabric.spec, ports)
    # sources: every leaf, valid prefixes, none given to two leaves
    sources: dict[str, tuple[ipaddress.IPv4Network, ...]] = {}
    owner: dict[ipaddress.IPv4Network, str] = {}
    for leaf, texts in data["sources"].items():
        if leaf not in fabric.leaves:
            raise _fail(path, f"sources.{leaf}", f"no such leaf in a fabric of {fabric.spec.leaves} leaves")
        nets = tuple(_prefix(path, leaf, t) for t in texts)
        for net in nets:
            if net in owner:
                raise _fail(path, f"sources.{leaf}", f"{net} is also given to {owner[net]}; a prefix belongs to one leaf")
            owner[net] = leaf
        sources[leaf] = nets
    missing = [leaf for leaf in fabric.leaves if leaf not in sources]
    if missing:
        raise _fail(path, "sources", f"no prefixes for {', '.join(missing)}: the detector compares every source leaf")
    if len(owner) > MAX_PREFIXES:
        raise _fail(path, "sources", f"{len(owner)} prefixes; the counting program holds {MAX_PREFIXES}: aggregate them")
    weights = {}
    for text, w in (data.get("weights") or {}).items():
        link = _link(path, fabric, "weights", text)
        if node_kind(link.src) != "leaf" or node_kind(link.dst) != "spine":
            raise _fail(path, "weights", f"{text}: weights are on uplinks, leafL->spineK")
        weights[link.name] = float(w)
    oos = tuple(link for t in data.get("out_of_service") or [] for link in _links(path, fabric, "out_of_service", t))
    degraded = tuple(link for t in data.get("degraded") or [] for link in _links(path, fabric, "degraded", t))
    counters = CounterSource(data.get("counters", "ebpf"))
    if counters is CounterSource.NETLINK and (oos or weights or degraded):
        raise _fail(path, "counters", "netlink gives totals without a per-source split, which are judged only when "
                                      "every leaf sprays alike: no out_of_service, weights or degraded links "
                                      "(use counters: ebpf)")
    state_dir = _dir(path, data.get("state_dir", str(DEFAULT_STATE_DIR)))
    verdict_dir = _dir(path, data["verdict_dir"]) if "verdict_dir" in data else None
    verdict_key = _dir(path, data["verdict_key"]) if "verdict_key" in data else None
    peers = dict(data["peers"]) if data.get("peers") else None
    if peers:
        bad = sorted(set(peers) - set(fabric.switches))
        if bad:
            raise _fail(path, f"peers.{bad[0]}", f"not a switch of this fabric ({', '.join(fabric.switches)})")
    peer_files = {k: _dir(path, data[k]) for k in ("peer_ca_file", "peer_password_file") if k in data}
    return Site(path=path, switch=switch, fabric=fabric, ifnames=ifnames, sources=sources,
                counters=counters, gap_ms=float(data.get("pulse_gap_ms", 50)),
                spray=SprayMode.parse(data.get("spray", "rrdst")), weights=weights, out_of_service=oos,
                degraded=degraded, state_dir=state_dir, verdict_dir=verdict_dir, verdict_key=verdict_key,
                peers=peers, peer_ca_file=peer_files.get("peer_ca_file"), peer_user=data.get("peer_user"),
                peer_password_file=peer_files.get("peer_password_file"),
                peer_timeout_s=float(data.get("peer_timeout_s", Site.peer_timeout_s)))


def _links(path: Path, fabric: Fabric, where: str, text: str) -> list[Link]:
    """``a->b`` or both directions ``a<->b``."""
    try:
        return fabric.parse_links(str(text))
    except SpecError as e:
        raise _fail(path, where, str(e)) from None


def _link(path: Path, fabric: Fabric, where: str, text: str) -> Link:
    links = _links(path, fabric, where, text)
    if len(links) != 1:
        raise _fail(path, where, f"{text} names both directions; name one, e.g. {links[0].name}")
    return links[0]


def site_of_testbed(tb, switch: str) -> dict:
    """The site file of one switch of a running testbed (``tb``: netns_testbed.state.Testbed), as a dict."""
    fabric = tb.fabric
    if switch not in fabric.switches:
        raise SpecError(f"unknown switch {switch!r}: this fabric has {', '.join(fabric.switches)}")
    spec = fabric.spec
    return {
        "flowpulse_site": 1,
        "switch": switch,
        "fabric": {"leaves": spec.leaves, "spines": spec.spines, "hosts_per_leaf": spec.hosts_per_leaf,
                   "mtu": spec.mtu},
        "counters": "ebpf",
        "pulse_gap_ms": tb.state.gap_ms,
        "spray": str(tb.state.spray),
        "weights": dict(tb.state.weights),
        "ports": {p.ifname: p.peer for p in fabric.ports[switch]},
        "sources": {leaf: [str(Fabric.leaf_subnet(leaf))] for leaf in fabric.leaves},
        "out_of_service": [link.name for link in tb.out_of_service],
        "degraded": [],
    }


def dump_site(data: dict) -> str:
    head = (f"# FlowPulse site: {data['switch']} (schema: agent/site.schema.json)\n"
            f"# run: sudo flowpulse agent --site THIS_FILE  (in the machine or namespace of {data['switch']})\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
