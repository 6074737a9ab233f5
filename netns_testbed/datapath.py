"""The eBPF switch datapath: compile and attach (BCC), then read and steer it (pinned maps).

``bpf/switch.c`` is compiled by BCC once per fabric (map sizes as ``-D`` flags,
sized for the fabric's largest switch, so leaves and spines share the compile);
each switch namespace gets its own copy of the maps and of the verified programs
(:class:`Template`), its identity in its config map, attached to every port
(tcx links, or tc clsact); its maps are pinned under ``<state dir>/bpf/<switch>/`` so other
processes (CLI, agents) use them after the loader exits. Readers need only
:class:`SwitchMaps`.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes as ct
import ipaddress
import logging
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from netns_testbed import bpfcache
from netns_testbed.errors import EnvironmentProblem
from netns_testbed.bpfmaps import (MapSpec, PinnedArray, RingWakeups, map_create, map_fds_in, map_spec, obj_pin,
                                   patch_map_fds, prog_load)
from netns_testbed.contract import drift_from, static_asserts
from netns_testbed.nsutil import iproute
from netns_testbed.topo import Fabric, Link, SprayMode, node_kind, node_num

log = logging.getLogger("flowpulse.datapath")
BPF_DIR = Path(__file__).with_name("bpf")
SRC = BPF_DIR / "switch.c"

KINDS = ("tcp_data", "tcp_ctrl", "other_ip", "non_ip", "bad_hdr")
NKIND = len(KINDS)
DIRS = ("in", "out")
SPRAY_OFF = 0                      # FP_SPRAY_OFF: plain kernel routing
SPRAY_CODES: dict[SprayMode, int] = {SprayMode.RANDOM: 1, SprayMode.RR: 2, SprayMode.RRDST: 3}   # FP_SPRAY_<NAME>
SPRAY_SLOTS = 256
IFINDEX_SLOTS = 1024      # a port's interface index in its namespace is below this (switch.h)
FAULT_NONE, FAULT_DROP, FAULT_CORRUPT = 0, 1, 2
PROB_ONE = 1 << 32
FLOW_ALL = 0xFFFFFFFF
PULSE_TIME_BITS = 40
PULSE_UNIT_SHIFT = 20
PULSE_UNIT_NS = 1 << PULSE_UNIT_SHIFT
HOOKS = {"ingress": 0, "egress": 1}
MAX_PREFIXES = 1024
RING = 16                 # pulses each switch keeps per counter (ring slots; -DFP_RING)
PULSE_ID_BITS = 64 - PULSE_TIME_BITS   # the kernel's pulse id shares a word with the last packet's time
PIN_NAMES = ("counters", "dup", "totals", "pulses", "ifindex_port", "port_out", "config", "pulse", "spray", "spray_bank",
             "rotation", "faults", "fault_stats", "spray_stats", "spans", "pulse_events")
WAKEUPS = "pulse_events"  # the ring buffer that says a pulse opened (counting.inc): not an array, no mirror
FLOWS = 8192              # TCP flows whose sequence spans a switch tracks (LRU; switch.h FP_FLOWS)
SPAN_LIMIT = 1 << 24      # a larger advance of a flow's highest end restarts it (switch.h)


def net_u32(addr: ipaddress.IPv4Address) -> int:
    """An IPv4 address as the u32 whose bytes in memory are the address in network order (what the
    C side compares with a header's field, unconverted)."""
    return int.from_bytes(addr.packed, sys.byteorder)


class Counter(ct.Structure):
    _fields_ = [("pkts", ct.c_uint64), ("bytes", ct.c_uint64)]


class Count(ct.Structure):
    _fields_ = [("pulse", ct.c_uint32), ("pkts", ct.c_uint32 * NKIND)]


class Dup(ct.Structure):
    _fields_ = [("pulse", ct.c_uint64), ("segs", ct.c_uint64), ("bytes", ct.c_uint64)]


class PulseRec(ct.Structure):
    _fields_ = [("pulse", ct.c_uint64), ("start_ns", ct.c_uint64), ("end_ns", ct.c_uint64)]


class FlowKey(ct.Structure):
    _fields_ = [("saddr", ct.c_uint32), ("daddr", ct.c_uint32), ("ports", ct.c_uint32), ("port", ct.c_uint32)]


class Flow(ct.Structure):
    _fields_ = [("end", ct.c_uint32), ("prev", ct.c_uint32), ("id", ct.c_uint16), ("by_ack", ct.c_uint16)]


class Span(ct.Structure):
    _fields_ = [("pulse", ct.c_uint32), ("first", ct.c_uint32), ("resent", ct.c_uint32), ("pad", ct.c_uint32),
                ("new_bytes", ct.c_uint64), ("span", ct.c_uint64)]


SPAN_FIELDS = ("first", "resent", "new_bytes", "span")   # PulseSlot.spans' (and PulseCounts.span's) last axis
SPAN_FIRST, SPAN_RESENT, SPAN_NEW, SPAN_BYTES = range(len(SPAN_FIELDS))


class Config(ct.Structure):
    _fields_ = [("mode", ct.c_uint32), ("gap_units", ct.c_uint32), ("leaf_class", ct.c_uint32),
                ("nuplinks", ct.c_uint32), ("nhosts", ct.c_uint32), ("sink", ct.c_uint32)]


class PortOut(ct.Structure):
    _fields_ = [("ifindex", ct.c_uint32), ("nh4", ct.c_uint32)]


class Spray(ct.Structure):
    _fields_ = [("len", ct.c_uint32), ("slot", ct.c_uint8 * SPRAY_SLOTS)]


class Fault(ct.Structure):
    _fields_ = [("kind", ct.c_uint32), ("match_ip", ct.c_uint32), ("prob", ct.c_uint64),
                ("src_net", ct.c_uint32), ("src_mask", ct.c_uint32), ("dst_net", ct.c_uint32),
                ("dst_mask", ct.c_uint32), ("flow_frac", ct.c_uint32), ("pad", ct.c_uint32),
                ("period_ns", ct.c_uint64), ("on_ns", ct.c_uint64), ("t0_ns", ct.c_uint64)]


class FaultStats(ct.Structure):
    _fields_ = [("matched", ct.c_uint64), ("hit", ct.c_uint64)]


class PrefixKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint32)]


class Shape(ct.Structure):
    """struct fp_shape: the compiled counting object's .rodata (bpf/libbpf_compat.h; netns_testbed.bpfobject)."""
    _fields_ = [("nports", ct.c_uint32), ("nsrc", ct.c_uint32)]


class U64(ct.Structure):
    _fields_ = [("v", ct.c_uint64)]


class U32(ct.Structure):
    _fields_ = [("v", ct.c_uint32)]


# What bpf/switch.h says, as Python sees it: compiled into the program as assertions (netns_testbed.contract)
C_STRUCTS: dict[str, type[ct.Structure]] = {"fp_counter": Counter, "fp_count": Count, "fp_dup": Dup,
                                            "fp_pulse_rec": PulseRec,
                                            "fp_config": Config, "fp_port": PortOut, "fp_spray": Spray,
                                            "fp_fault": Fault, "fp_fault_stats": FaultStats,
                                            "fp_prefix_key": PrefixKey, "fp_flow_key": FlowKey,
                                            "fp_flow": Flow, "fp_span": Span}
C_CONSTANTS: dict[str, int] = {
    "FP_DIR_IN": DIRS.index("in"), "FP_DIR_OUT": DIRS.index("out"),
    "FP_HOOK_INGRESS": HOOKS["ingress"], "FP_HOOK_EGRESS": HOOKS["egress"],
    "FP_KIND_TCP_DATA": KINDS.index("tcp_data"), "FP_KIND_TCP_CTRL": KINDS.index("tcp_ctrl"),
    "FP_KIND_OTHER": KINDS.index("other_ip"), "FP_KIND_NONIP": KINDS.index("non_ip"),
    "FP_KIND_BADHDR": KINDS.index("bad_hdr"), "FP_NKIND": NKIND,
    "FP_SPRAY_OFF": SPRAY_OFF, **{f"FP_SPRAY_{mode.name}": code for mode, code in SPRAY_CODES.items()},
    "FP_SPRAY_SLOTS": SPRAY_SLOTS, "FP_IFINDEX_SLOTS": IFINDEX_SLOTS,
    "FP_FAULT_NONE": FAULT_NONE, "FP_FAULT_DROP": FAULT_DROP, "FP_FAULT_CORRUPT": FAULT_CORRUPT,
    "FP_PROB_ONE": PROB_ONE, "FP_ALL": FLOW_ALL,
    "FP_PULSE_TIME_BITS": PULSE_TIME_BITS, "FP_PULSE_UNIT_SHIFT": PULSE_UNIT_SHIFT,
    "FP_MAX_PREFIXES": MAX_PREFIXES, "FP_FLOWS": FLOWS, "FP_SPAN_LIMIT": SPAN_LIMIT,
}


@dataclass(frozen=True)
class SwitchShape:
    """Compile-time shape of one switch's program, derived from the fabric model.

    ``nports`` is the switch's own port count; its maps have ``port_slots`` port entries (``slots``:
    the fabric's largest switch; 0: its own), so that every switch of a fabric runs one compile.
    Readers see only the first ``nports``."""

    nports: int
    nleaves: int
    is_leaf: bool
    leaf_id: int
    nuplinks: int
    ring: int = RING
    slots: int = 0

    @property
    def port_slots(self) -> int:
        """Ports the program's maps are sized for (its NPORTS)."""
        return max(self.slots, self.nports)

    @property
    def nhosts(self) -> int:
        """A leaf's host ports (after its uplinks); 0 on a spine (config map)."""
        return self.nports - self.nuplinks if self.is_leaf else 0

    @property
    def nsrc(self) -> int:
        """Source classes: 0 other IPv4, 1..L source leaf + 1, L+1 not IPv4."""
        return self.nleaves + 2

    @property
    def ncounters(self) -> int:
        """Ring elements of one pulse (one per port slot, direction and source class)."""
        return self.port_slots * 2 * self.nsrc

    @classmethod
    def of(cls, fabric: Fabric, switch: str) -> "SwitchShape":
        leaf = node_kind(switch) == "leaf"
        return cls(len(fabric.ports[switch]), fabric.spec.leaves, leaf,
                   node_num(switch) if leaf else 0, fabric.spec.spines if leaf else 0,
                   slots=max(len(fabric.ports[s]) for s in fabric.switches))

    def cflags(self) -> list[str]:
        """What the program is compiled with: the sizes of its maps, not which switch runs it (the
        switch's role, leaf number and uplinks are in its config map), so that every switch of a
        fabric shares one compile."""
        return [f"-I{BPF_DIR}", f"-DNPORTS={self.port_slots}", f"-DNLEAVES={self.nleaves}",
                f"-DNSRC={self.nsrc}", f"-DFP_RING={self.ring}"]

    @property
    def leaf_class(self) -> int:
        """This switch's own source class (leaf number + 1) on a leaf; 0 on a spine (config map)."""
        return self.leaf_id + 1 if self.is_leaf else 0


def counter_map_entries(shape: SwitchShape) -> dict[str, tuple[type, int, bool]]:
    """Value type, size and per-CPU flag of the maps every FlowPulse program keeps (bpf/packet.h)."""
    return {
        "counters": (Count, shape.ring * shape.ncounters, True),
        "dup": (Dup, shape.ring * shape.port_slots * 2, True),
        "totals": (Counter, shape.port_slots * 2 * NKIND, True),
        "pulse": (U64, 2, False),
        "pulses": (PulseRec, shape.ring, False),
    }


def map_entries(shape: SwitchShape) -> dict[str, tuple[type, int, bool]]:
    """Value type, size and per-CPU flag of each pinned array (mirrors switch.c)."""
    return {
        **counter_map_entries(shape),
        "ifindex_port": (U32, IFINDEX_SLOTS, False),
        "port_out": (PortOut, shape.port_slots, False),
        "config": (Config, 1, False),
        "spray": (Spray, 2 * shape.nleaves, False),    # two banks (switch.h, struct fp_spray)
        "spray_bank": (U32, 1, False),
        "rotation": (U32, shape.nleaves + 1, True),
        "faults": (Fault, shape.port_slots * 2, False),
        "fault_stats": (FaultStats, shape.port_slots * 2, True),
        "spray_stats": (U64, shape.port_slots, True),
        "spans": (Span, shape.ring * shape.port_slots * shape.nsrc, True),
    }


def contract_asserts(shape: SwitchShape) -> str:
    """The assertions compiled with the program: the mirrors, and this switch's map sizes."""
    return static_asserts(C_STRUCTS, {**C_CONSTANTS, "NSRC": shape.nsrc, "FP_RING": shape.ring,
                                      "NPORTS * 2 * NSRC": shape.ncounters})


SPLICE = re.compile(r"^// FLOWPULSE_SPLICE\(([\w.]+)\).*$", re.M)


def source_text(path: Path) -> str:
    """A program's C text as BCC compiles it: each ``// FLOWPULSE_SPLICE(file)`` line replaced by that
    file of the program's own directory (bpf/; another revision's for bench/program_cost.py) (BCC
    rewrites map accesses only in the text it is given, not in #included files; bpf/counting.inc says
    more)."""
    def splice(m: re.Match) -> str:
        name = m.group(1)
        return f"// ---- {name} ----\n{(path.parent / name).read_text()}// ---- end of {name} ----"
    return SPLICE.sub(splice, path.read_text())


def program_text(shape: SwitchShape) -> str:
    """What one switch compiles: switch.c (counting.inc spliced in) and the contract's assertions."""
    return source_text(SRC) + "\n" + contract_asserts(shape)


def bpf_source_with_flags(shape: SwitchShape) -> str:
    """The C source and flags one switch compiles with (for the hidden --dump-bpf)."""
    return f"// cflags: {' '.join(shape.cflags())}\n" + program_text(shape)


def load_bcc():
    """Import BCC or say how to get it."""
    try:
        from bcc import BPF  # noqa: F401
    except ImportError:
        raise EnvironmentProblem(
            "BCC is not importable: install python3-bpfcc (sudo scripts/setup.sh does it)") from None
    return BPF


def headers_dir() -> Path:
    """The kernel headers BCC compiles against."""
    src = os.environ.get("BCC_KERNEL_SOURCE")
    return Path(src) if src else Path("/lib/modules") / os.uname().release / "build"


def check_headers() -> None:
    """BCC compiles against kernel headers; say how to get them before it fails obscurely."""
    build = headers_dir()
    if not (build / "include").is_dir() and not (build / "Makefile").exists():
        raise EnvironmentProblem(
            f"kernel headers not found at {build}: run sudo scripts/setup.sh (installs linux-headers "
            "and links them for this kernel) or set BCC_KERNEL_SOURCE")


class _Captured:
    text = ""


@contextlib.contextmanager
def fd2_captured():
    """What C code in this process (a compiler, libbpf) writes to file descriptor 2 inside the block,
    collected into the yielded object's ``text`` (never raw lines on stderr: an agent's --log-json stream
    stays JSON)."""
    got = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield got
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            got.text = tmp.read().decode(errors="replace")


@contextlib.contextmanager
def compiler_output():
    """Collect what BCC's compiler writes to file descriptor 2 (its diagnostics never reach the
    exception) and hand it to :func:`log_compiler_output` (the contract's drift is named instead)."""
    got = None
    try:
        with fd2_captured() as got:
            yield got
    finally:        # also when the compile failed: its errors are logged here
        if got is not None and got.text and not drift_from(got.text):
            log_compiler_output(got.text)


def log_compiler_output(text: str) -> None:
    """The compiler's diagnostics as log records, never raw lines on stderr (an agent's --log-json
    stream stays JSON). Errors in full; warnings (clang on a newer kernel's headers: 6.12's print
    -Wignored-attributes and -Wduplicate-decl-specifier) as one line, in full at debug level."""
    lines = text.rstrip().splitlines()
    warnings = [line for line in lines if ": warning:" in line]
    if any(": error:" in line for line in lines):
        log.error("BCC's compiler said:\n%s", text.rstrip())
    elif warnings:
        log.info("BCC's compiler printed %d warning(s) on the kernel headers, the first: %s (-vv shows them all)",
                 len(warnings), warnings[0].strip())
        log.debug("BCC's compiler said:\n%s", text.rstrip())
    else:
        log.debug("BCC's compiler said:\n%s", text.rstrip())


def compile_program(text: str, cflags: list[str], functions: tuple[str, ...]):
    """Compile a FlowPulse program (switch.c, count.c) with BCC; returns (bpf object, {name: fn}),
    each function in ``functions`` loaded (verified) in the kernel."""
    BPF = load_bcc()
    check_headers()
    diagnostics = _Captured()
    try:
        with compiler_output() as diagnostics:
            b = BPF(text=text.encode(), cflags=cflags)
        return b, {name: b.load_func(name.encode(), BPF.SCHED_CLS) for name in functions}
    except Exception as e:  # BCC raises plain Exception on compile/load failure
        drift = drift_from(diagnostics.text)
        if drift:
            raise EnvironmentProblem(f"datapath.py and bpf/switch.h disagree: {drift}: a source tree out of "
                                     "step; fix the mirror in netns_testbed/datapath.py or the header") from None
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "kernel headers" in msg or "kconfig.h" in msg or "chdir" in msg:
            raise EnvironmentProblem(
                f"BCC cannot find kernel headers ({msg}): run sudo scripts/setup.sh, which installs "
                "linux-headers and links /lib/modules/$(uname -r)/build") from None
        raise EnvironmentProblem(f"eBPF program failed to compile or load ({msg}): check that the kernel "
                                 "has BPF, BTF and tc clsact (see docs/getting-started.md)") from None


SWITCH_FUNCTIONS = ("fp_ingress", "fp_egress")


@dataclass(frozen=True)
class Template:
    """The switch program compiled once for one shape (BCC): each function's instructions, which name
    the template's maps by descriptor, and those maps' specs. :meth:`instantiate` gives a switch its
    own maps and its own verified copy of the programs, with no compiler involved (milliseconds,
    where a BCC compile takes a second or more)."""

    cflags: tuple[str, ...]
    insns: dict[str, bytes]           # function -> instructions
    specs: dict[int, MapSpec]         # template map descriptor (as the instructions name it) -> spec
    names: dict[str, int]             # map name -> template descriptor
    license: bytes

    def instantiate(self) -> "SwitchProgram":
        fds: dict[int, int] = {}
        progs: dict[str, int] = {}
        try:
            for old, spec in self.specs.items():
                fds[old] = map_create(spec)
            for fn, code in self.insns.items():
                progs[fn] = prog_load(patch_map_fds(code, fds), fn, self.license)
        except OSError as e:
            for fd in [*fds.values(), *progs.values()]:
                os.close(fd)
            raise EnvironmentProblem(f"eBPF program failed to load ({e.strerror}): check that the kernel has "
                                     "BPF and tc clsact (see docs/getting-started.md)") from None
        return SwitchProgram({name: fds[old] for name, old in self.names.items()}, progs, list(fds.values()))

    @staticmethod
    def maps_named(insns: dict[str, bytes], names: dict[str, int]) -> set[int]:
        """The template descriptors a copy must recreate: those the instructions load, and the pinned ones."""
        return {fd for code in insns.values() for fd in map_fds_in(code)} | set(names.values())


@dataclass
class SwitchProgram:
    """One switch's loaded programs and maps, held by this process (descriptors) until :meth:`close`;
    pins and tc filters keep them alive after that."""

    maps: dict[str, int]              # map name -> descriptor
    progs: dict[str, int]             # function -> program descriptor
    _all_maps: list[int]

    def map_fd(self, name: str) -> int:
        return self.maps[name]

    def close(self) -> None:
        for fd in [*self._all_maps, *self.progs.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._all_maps, self.progs, self.maps = [], {}, {}


def compile_template(shape: SwitchShape) -> Template:
    """Compile switch.c for ``shape`` (BCC) and keep what copies of it need; the compiler's own maps
    and module are released."""
    b, _ = compile_program(program_text(shape), shape.cflags(), ())
    try:
        insns = {fn: b.dump_func(fn.encode()) for fn in SWITCH_FUNCTIONS}
        names = {name: b[name.encode()].map_fd for name in PIN_NAMES}
        specs = {fd: map_spec(fd) for fd in sorted(Template.maps_named(insns, names))}
        license = _module_license(b)
    finally:
        b.cleanup()
    return Template(tuple(shape.cflags()), insns, specs, names, license)


def cache_key(shape: SwitchShape) -> str:
    """The on-disk cache's name for ``shape``'s compile (netns_testbed.bpfcache)."""
    load_bcc()
    from bcc import __version__ as bcc_version
    return bpfcache.key(program_text(shape), shape.cflags(), headers_dir(), str(bcc_version))


def template_to_json(t: Template) -> dict:
    return {"cflags": list(t.cflags), "license": t.license.decode(),
            "insns": {fn: base64.b64encode(code).decode() for fn, code in t.insns.items()},
            "specs": {str(fd): [*spec[:5], spec[5].decode(errors="replace")] for fd, spec in t.specs.items()},
            "names": t.names}


def template_from_json(d: dict, shape: SwitchShape) -> Template | None:
    """A cached template, or None if the entry is not one for ``shape`` (checked field by field:
    what is loaded into the kernel comes from it)."""
    try:
        insns = {fn: base64.b64decode(d["insns"][fn], validate=True) for fn in SWITCH_FUNCTIONS}
        specs = {int(fd): MapSpec(*(int(x) for x in v[:5]), str(v[5]).encode()) for fd, v in d["specs"].items()}
        names = {name: int(d["names"][name]) for name in PIN_NAMES}
        t = Template(tuple(str(c) for c in d["cflags"]), insns, specs, names, str(d["license"]).encode())
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    if (t.cflags != tuple(shape.cflags()) or not Template.maps_named(insns, names) <= set(specs)
            or any(len(c) % 8 for c in insns.values())):
        return None
    return t


def _module_license(b) -> bytes:
    from bcc import lib
    lic = lib.bpf_module_license(b.module)
    return ct.string_at(lic) if lic else b"GPL"


class Loader:
    """Loads switch programs, compiling each program shape once (a fabric's switches share one
    compile: :class:`SwitchShape`); and once compiled, kept on disk for the next `fabric up`
    (netns_testbed.bpfcache). ``compiled`` counts the compiles this loader ran."""

    def __init__(self) -> None:
        self.templates: dict[tuple[str, ...], Template] = {}
        self.compiled = 0

    def load(self, shape: SwitchShape) -> SwitchProgram:
        key = tuple(shape.cflags())
        if key in self.templates:
            return self.templates[key].instantiate()
        name = cache_key(shape)
        entry = bpfcache.load(name)
        cached = template_from_json(entry, shape) if entry is not None else None
        if cached is not None:
            try:
                prog = cached.instantiate()
                self.templates[key] = cached
                return prog
            except EnvironmentProblem:
                bpfcache.drop(name)          # no longer loads (it should not happen): compile again
        t = compile_template(shape)
        self.compiled += 1
        prog = t.instantiate()
        self.templates[key] = t
        bpfcache.store(name, template_to_json(t))
        return prog


_OTHER_VERSION = ("{switch}: the testbed's datapath was built by another version of FlowPulse ({what}): "
                  "rebuild it with `flowpulse fabric down` and `fabric up` (same --prefix)")


def check_pinned(maps: dict[str, PinnedArray], switch: str) -> None:
    """The pinned maps are the ones this version's program makes: each map's value size and entries as
    the kernel reports them equal what the Python mirror reads and writes (a testbed built by an older
    checkout keeps running its own program after an upgrade, and a write of a grown struct into a
    smaller map would be cut short without an error)."""
    for name, m in maps.items():
        _, _, value_size, entries, _, _ = map_spec(m.fd)
        want = (ct.sizeof(m.value_type), m.entries)
        if (value_size, entries) != want:
            raise EnvironmentProblem(_OTHER_VERSION.format(
                switch=switch, what=f"map {name} holds {entries} values of {value_size} bytes, "
                                    f"this version expects {want[1]} of {want[0]}"))


def pin_dir(state_dir: Path, switch: str) -> Path:
    return state_dir / "bpf" / switch


LINK_PIN = re.compile(r"link_\d+_(ingress|egress)")    # a tcx link's pin beside the maps (builder.py)


def link_pin(state_dir: Path, switch: str, port: int, direction: str) -> Path:
    return pin_dir(state_dir, switch) / f"link_{port}_{direction}"


def pin_maps(prog: SwitchProgram, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in PIN_NAMES:
        obj_pin(prog.map_fd(name), str(directory / name))


@dataclass
class PulseSlot:
    """One pulse as the kernel's ring holds it (:meth:`CounterMaps.read_pulse`)."""

    pulse: int               # the kernel's 24-bit id
    counts: np.ndarray       # int64 packets [port, dir, src, kind]
    dups: np.ndarray         # int64 [port, dir, (D-SACKed segments, bytes they report)]
    start_ns: int            # first IPv4 packet (monotonic ns); 0 if the slot's record is gone
    end_ns: int              # last IPv4 packet's time unit; 0 while the pulse is open
    overwritten: bool        # a later pulse has started to reuse the slot: counts are incomplete
    spans: np.ndarray | None = None   # int64 [port, remote leaf class, SPAN_FIELDS]; None: not kept


class CounterMaps:
    """Reading the counters and the pulse clock that every FlowPulse program keeps (bpf/packet.h).

    Subclasses open ``self.maps`` (name -> PinnedArray) with at least :func:`counter_map_entries`,
    and set ``self.shape``, ``self.nports`` and ``self.nsrc``.
    """

    maps: dict[str, PinnedArray]
    shape: SwitchShape
    nports: int
    nsrc: int
    wakeups: "RingWakeups | None" = None   # the "a pulse opened" ring (WAKEUPS), if the program has one

    def close(self) -> None:
        for m in self.maps.values():
            m.close()
        if self.wakeups is not None:
            self.wakeups.close()
            self.wakeups = None

    @property
    def ring(self) -> int:
        return self.shape.ring

    def totals(self) -> np.ndarray:
        """Cumulative counts since the program loaded: int64 [port, dir, kind, (pkts, bytes)]."""
        slots = self.shape.port_slots
        return _pkts_bytes(self.maps["totals"].get_all_array()).reshape(slots, 2, NKIND, 2)[:self.nports]

    def pulse_state(self) -> tuple[int, int, int]:
        """(pulse id (24 bits), last IPv4 packet time ns (2^20 ns resolution), current pulse start ns)."""
        packed = self.maps["pulse"].get(0).v
        start = self.maps["pulse"].get(1).v
        return packed >> PULSE_TIME_BITS, (packed & ((1 << PULSE_TIME_BITS) - 1)) * PULSE_UNIT_NS, start

    def read_pulse(self, pulse: int) -> PulseSlot:
        """The counts of kernel pulse ``pulse`` (24-bit id) from its ring slot: per element and CPU,
        only the values tagged with that pulse (older tags are elements the pulse never touched)."""
        slot = pulse % self.ring
        slots = self.shape.port_slots
        n, nd = self.shape.ncounters, slots * 2
        counts, newer = sum_pulse(self.maps["counters"].get_range_per_cpu(slot * n, n), pulse)
        dups, dnewer = sum_tagged(self.maps["dup"].get_range_per_cpu(slot * nd, nd), pulse, ("segs", "bytes"))
        spans, snewer = None, False
        if "spans" in self.maps:
            ns = slots * self.nsrc
            spans, snewer = sum_tagged(self.maps["spans"].get_range_per_cpu(slot * ns, ns), pulse, SPAN_FIELDS)
            spans = spans.reshape(slots, self.nsrc, len(SPAN_FIELDS))[:self.nports]
        rec = self.maps["pulses"].get(slot)
        ours = rec.pulse == pulse
        return PulseSlot(pulse, counts.reshape(slots, 2, self.nsrc, NKIND)[:self.nports],
                         dups.reshape(slots, 2, 2)[:self.nports],
                         rec.start_ns if ours else 0, rec.end_ns if ours else 0,
                         newer or dnewer or snewer or (not ours and _is_newer(rec.pulse, pulse)), spans)


def sum_pulse(per_cpu: np.ndarray, pulse: int) -> tuple[np.ndarray, bool]:
    """fp_count values [element, cpu] summed over the CPUs that hold ``pulse``: int64 [element, kind];
    and whether any value already belongs to a later pulse."""
    mine, newer = _tags(per_cpu["pulse"], pulse)
    # a batched matrix product [1, cpu] x [cpu, kind] per element, in float64 (BLAS; exact below 2^53)
    summed = np.matmul(mine.astype(np.float64)[:, None, :], per_cpu["pkts"].astype(np.float64))
    return summed.reshape(len(per_cpu), -1).astype(np.int64), newer


def sum_tagged(per_cpu: np.ndarray, pulse: int, fields: tuple[str, ...]) -> tuple[np.ndarray, bool]:
    """Per-CPU elements tagged with their pulse (``pulse`` field), [element, cpu]: each of ``fields``
    summed over the CPUs that hold ``pulse``, int64 [element, field]; and whether any value already
    belongs to a later pulse."""
    mine, newer = _tags(per_cpu["pulse"], pulse)
    return np.stack([np.where(mine, per_cpu[f], 0).sum(axis=1, dtype=np.int64) for f in fields], -1), newer


def _is_newer(tag: int, pulse: int) -> bool:
    """Is 24-bit pulse id ``tag`` later than ``pulse`` (modulo the wrap)?"""
    d = (int(tag) - pulse) % (1 << PULSE_ID_BITS)
    return 0 < d < (1 << (PULSE_ID_BITS - 1))


def _tags(tags: np.ndarray, pulse: int) -> tuple[np.ndarray, bool]:
    """Which values [element, cpu] belong to ``pulse``, and whether any already holds a later one
    (the slot was reused: the pulse's counts are incomplete)."""
    tags = tags.astype(np.int64)
    d = (tags - pulse) % (1 << PULSE_ID_BITS)
    return tags == pulse, bool(((d > 0) & (d < (1 << (PULSE_ID_BITS - 1)))).any())


def _pkts_bytes(values: np.ndarray) -> np.ndarray:
    """fp_counter elements (numpy structured) as int64 [element, (pkts, bytes)]."""
    return np.stack([values["pkts"], values["bytes"]], axis=-1).astype(np.int64)


class SwitchMaps(CounterMaps):
    """Handles on one testbed switch's pinned maps: counters, pulse state, spray tables, faults."""

    def __init__(self, fabric: Fabric, state_dir: Path, switch: str, readonly: bool = False) -> None:
        """``readonly``: descriptors that only read (the agent: it never changes the datapath)."""
        self.fabric = fabric
        self.switch = switch
        self.shape = SwitchShape.of(fabric, switch)
        self.nports, self.nsrc = self.shape.nports, self.shape.nsrc
        d = self.pins = pin_dir(state_dir, switch)
        self.maps = {}
        try:
            for name, (t, n, pc) in map_entries(self.shape).items():
                self.maps[name] = PinnedArray(str(d / name), t, n, pc, readonly=readonly)
            check_pinned(self.maps, switch)
            try:
                self.wakeups = RingWakeups(str(d / WAKEUPS))
            except FileNotFoundError:
                self.wakeups = None   # a testbed built by a version without it: readers poll the clock
        except FileNotFoundError:
            self.close()
            extra = sorted(n for n in (os.listdir(d) if d.is_dir() else ()) if n not in PIN_NAMES
                           and not LINK_PIN.fullmatch(n))
            if extra:
                raise EnvironmentProblem(_OTHER_VERSION.format(
                    switch=switch, what=f"maps this version does not know: {', '.join(extra)}")) from None
            raise                     # the testbed is gone (or going): the caller says so
        except BaseException:
            self.close()
            raise

    @classmethod
    def of_program(cls, fabric: Fabric, switch: str, prog: SwitchProgram) -> "SwitchMaps":
        """Handles on the maps of a program this process compiled and holds (not pinned): the
        datapath's unit tests run the program with BPF_PROG_TEST_RUN and look at its maps."""
        self = cls.__new__(cls)
        self.fabric, self.switch = fabric, switch
        self.shape = SwitchShape.of(fabric, switch)
        self.nports, self.nsrc = self.shape.nports, self.shape.nsrc
        self.pins = None
        self.maps = {name: PinnedArray(name, t, n, pc, fd=prog.map_fd(name))
                     for name, (t, n, pc) in map_entries(self.shape).items()}
        return self

    def identity(self) -> tuple[int, int]:
        """Which maps the pins hold now: a reload (``fabric reload``) replaces them."""
        st = os.stat(self.pins / "counters")
        return st.st_ino, st.st_ctime_ns

    # -- set-up (loader) ----------------------------------------------------
    def set_ports(self, ifindexes: list[int]) -> None:
        """Tell the program which interface is which port (``ifindexes[port]``), both ways, and each
        port's next hop: the neighbour's address on that link, from the fabric model."""
        far = [ifx for ifx in ifindexes if not 0 < ifx < IFINDEX_SLOTS]
        if far:
            raise EnvironmentProblem(f"{self.switch}: interface index {far[0]} is outside the datapath's port table "
                                     f"(1..{IFINDEX_SLOTS - 1}); a switch namespace numbers its own interfaces "
                                     "from 1, so something else created them: rebuild with `fabric up`")
        for port, ifx in enumerate(ifindexes):
            self.maps["ifindex_port"].set(ifx, U32(port + 1))
            self.maps["port_out"].set(port, PortOut(ifx, self._next_hop(port)))

    def _next_hop(self, port: int) -> int:
        """The neighbour's IPv4 address on ``port``'s link, in network byte order (the C side's nh4)."""
        p = self.fabric.ports[self.switch][port]
        return net_u32(self.fabric.ports[p.peer][p.peer_index].address.ip)

    def set_config(self, mode: SprayMode | None, gap_ms: float, sink: int | None = None) -> None:
        """Spray mode (None: spraying off, the kernel routes: a bench's baseline) and pulse gap; ``sink``:
        the ifindex injected drops go to (builder.py makes one per switch; None keeps the one set)."""
        units = max(1, int(round(gap_ms * 1e6 / PULSE_UNIT_NS)))
        if sink is None:
            sink = self.maps["config"].get(0).sink
        self.maps["config"].set(0, Config(SPRAY_OFF if mode is None else SPRAY_CODES[mode], units, self.shape.leaf_class, self.shape.nuplinks,
                                           self.shape.nhosts, sink))

    def set_spray(self, weights: dict[str, float], out_of_service: list[Link]) -> None:
        """Fill this leaf's per-destination spray tables from the fabric model, at once.

        Each table lists uplink ports, repeated in proportion to their weights and
        interleaved (smooth weighted round-robin) so that any window of the
        rotation is close to the target shares. The tables go into the bank the
        program does not use, then one write of ``spray_bank`` switches every
        destination over: no packet is sprayed by a half-written state.
        """
        if not self.shape.is_leaf:
            return
        bank = 1 - int(self.maps["spray_bank"].get(0).v)
        n = self.shape.nleaves
        for dst in self.fabric.leaves:
            shares = self.fabric.spray_shares(self.switch, dst, weights, out_of_service)
            table = smooth_wrr([(self.fabric.port_to(self.switch, s).index, w) for s, w in shares.items()])
            sp = Spray(len(table))
            for i, port in enumerate(table):
                sp.slot[i] = port
            self.maps["spray"].set(bank * n + node_num(dst), sp)
        self.maps["spray_bank"].set(0, U32(bank))

    def spray_table(self, dst: str) -> list[int]:
        """The uplink ports of the table in use towards leaf ``dst``, slot by slot."""
        bank = int(self.maps["spray_bank"].get(0).v)
        sp = self.maps["spray"].get(bank * self.shape.nleaves + node_num(dst))
        return list(sp.slot[:sp.len])

    # -- reading ------------------------------------------------------------
    def spray_stats(self) -> list[int]:
        return [int(v) for v in self.maps["spray_stats"].get_all_array()["v"][:self.nports]]

    def fault_stats(self, port: int, hook: str) -> FaultStats:
        return self.maps["fault_stats"].get(port * 2 + HOOKS[hook])

    def set_fault(self, port: int, hook: str, fault: Fault) -> None:
        self.maps["faults"].set(port * 2 + HOOKS[hook], fault)

    def clear_fault(self, port: int, hook: str) -> None:
        self.set_fault(port, hook, Fault())


def smooth_wrr(weighted: list[tuple[int, float]], slots: int = SPRAY_SLOTS) -> list[int]:
    """A spray table for integer-ish weights: nginx's smooth weighted round-robin.

    Equal weights give the plain rotation 0,1,2,...; unequal weights are scaled to
    integers (smallest exact table, at most ``slots`` entries) and spread evenly over the table.
    """
    if not weighted:
        return []
    ws = [w for _, w in weighted]
    if all(abs(w - ws[0]) < 1e-12 for w in ws):
        return [p for p, _ in weighted]
    fracs = [Fraction(w).limit_denominator(64) for w in ws]
    denom = math.lcm(*(f.denominator for f in fracs))
    ints = [int(f * denom) for f in fracs]
    g = math.gcd(*ints)
    ints = [max(1, i // g) for i in ints]
    if sum(ints) > slots:  # too fine-grained for the table: round to its size
        total = sum(ints)
        ints = [max(1, round(i * slots / total)) for i in ints]
        while sum(ints) > slots:
            ints[ints.index(max(ints))] -= 1
    current = [0] * len(ints)
    total = sum(ints)
    table = []
    for _ in range(total):
        for i, w in enumerate(ints):
            current[i] += w
        best = max(range(len(ints)), key=lambda i: current[i])
        current[best] -= total
        table.append(weighted[best][0])
    return table


def fault_struct(action: int, rate: float, src: ipaddress.IPv4Network | None = None,
                 dst: ipaddress.IPv4Network | None = None, flow_frac: float = 1.0, period_s: float = 0.0,
                 on_s: float = 0.0) -> Fault:
    """The kernel's fault record: ``action`` FAULT_DROP or FAULT_CORRUPT (FP_FAULT_*) on a share ``rate``
    of the packets from ``src`` to ``dst`` in a share ``flow_frac`` of the flows, flapping with
    ``period_s``/``on_s`` (netns_testbed.faults.kernel_record makes one from a FaultSpec)."""
    if action not in (FAULT_DROP, FAULT_CORRUPT):
        raise ValueError(f"no injector action {action}")
    f = Fault()
    f.kind = action
    f.prob = PROB_ONE if rate >= 1.0 else int(round(rate * PROB_ONE))
    if src or dst:
        f.match_ip = 1
        for which, net in (("src", src), ("dst", dst)):
            n = net or ipaddress.IPv4Network("0.0.0.0/0")
            setattr(f, f"{which}_net", net_u32(n.network_address))
            setattr(f, f"{which}_mask", net_u32(n.netmask))
    f.flow_frac = FLOW_ALL if flow_frac >= 1.0 else int(flow_frac * FLOW_ALL)
    if period_s > 0:
        f.period_ns = int(period_s * 1e9)
        f.on_ns = int(on_s * 1e9)
        f.t0_ns = time.monotonic_ns()
    return f


def interface_stats(netns_name: str) -> dict[str, dict[str, int]]:
    """The kernel's own per-interface packet/byte statistics inside a namespace."""
    out = {}
    with iproute(netns_name) as ipr:
        for link in ipr.get_links():
            st = link.get_attr("IFLA_STATS64")
            out[link.get_attr("IFLA_IFNAME")] = {
                "rx_packets": st["rx_packets"], "tx_packets": st["tx_packets"],
                "rx_bytes": st["rx_bytes"], "tx_bytes": st["tx_bytes"],
                "rx_dropped": st["rx_dropped"], "tx_dropped": st["tx_dropped"],
                "rx_errors": st["rx_errors"], "tx_errors": st["tx_errors"],
            }
    return out


def bpffs_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target and line.split()[2] == "bpf" for line in f)
