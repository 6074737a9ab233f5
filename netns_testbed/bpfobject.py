"""The site agent's counting program as a compiled object: built once with clang, loaded with libbpf.

A site agent runs on a real machine of the fabric, which should not need a compiler, LLVM or its
kernel's headers to count packets. ``bpf/count.c`` is therefore built at build time (``scripts/
setup.sh`` runs this module; ``pip install .`` after it ships the object in the wheel) into
``bpf/count.bpf.o``, and loaded at run time through libbpf (``libbpf1``, already what the agents read
maps through). The testbed's switches keep BCC; both compile the same text (``bpf/libbpf_compat.h``
says how BCC's syntax builds with plain clang).

The object is tied to the text it was built from: ``count.bpf.json`` beside it holds the SHA-256 of
that text (count.c with counting.inc spliced in, and the contract's assertions generated from the
Python mirrors), of the headers it includes and of the flags, and :func:`check_current` refuses an object built from other sources, so a mirror
that drifts from the C fails the build (its ``_Static_assert``), and a source that moved on without a
rebuild fails the load, with the command that rebuilds it.

What it needs from the kernel: BPF ring buffers (5.8), BTF-defined maps (the object's own BTF, loaded
with it) and tc clsact, or tcx from 6.6. It reads only the packet and ``__sk_buff``, which the
verifier rewrites for each kernel, so it has no CO-RE relocations and needs no ``/sys/kernel/btf``.

``python -m netns_testbed.bpfobject`` builds it (``--check`` says whether the object is current).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes as ct
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from netns_testbed import datapath as dp
from netns_testbed.bpfmaps import _call, libbpf
from netns_testbed.contract import drift_from, static_asserts
from netns_testbed.errors import EnvironmentProblem, ExitCode

log = logging.getLogger("flowpulse.bpfobject")
SRC = dp.BPF_DIR / "count.c"
OBJECT = dp.BPF_DIR / "count.bpf.o"
CLANGS = ("clang", *(f"clang-{v}" for v in range(21, 13, -1)))   # Debian names its clangs by version
RODATA_SHAPE = "fp_shape"         # the only variable of the object's .rodata (bpf/libbpf_compat.h)
REBUILD = "sudo scripts/setup.sh (or: python -m netns_testbed.bpfobject)"


def stamp_path(obj: Path) -> Path:
    return obj.with_suffix(".json")


def build_text() -> str:
    """What clang compiles: count.c (counting.inc spliced in) and the contract's assertions that do not
    depend on a site's shape (that is written at load), with the shape's own mirror."""
    structs = {**dp.C_STRUCTS, "fp_shape": dp.Shape}
    return dp.source_text(SRC) + "\n" + static_asserts(structs, {**dp.C_CONSTANTS, "FP_RING": dp.RING})


FLAGS = ("-target", "bpf", "-O2", "-g", "-Wall", "-Wno-unused-function", "-DFP_LIBBPF", f"-DFP_RING={dp.RING}")


def source_digest() -> str:
    """SHA-256 over what the object is built from: the compiled text, every header it includes from
    bpf/ (switch.h, packet.h, libbpf_compat.h) and the flags."""
    h = hashlib.sha256(build_text().encode())
    for header in sorted(dp.BPF_DIR.glob("*.h")):
        h.update(f"\0{header.name}\0".encode() + header.read_bytes())
    h.update("\0".join(FLAGS).encode())
    return h.hexdigest()


def find_clang() -> str:
    for name in CLANGS:
        path = shutil.which(name)
        if path:
            return path
    raise EnvironmentProblem("no clang to build the counting object: apt-get install clang (scripts/setup.sh "
                             "does it)")


def build(out: Path = OBJECT, clang: str | None = None) -> Path:
    """Compile count.c into ``out`` (and its stamp); the contract's drift names the fact."""
    clang = clang or find_clang()
    text = build_text()
    with tempfile.TemporaryDirectory(prefix="fp-bpfobj-") as tmp:
        tmpd = Path(tmp)
        # count.c includes <uapi/linux/...> as BCC's kernel tree spells it: the system's UAPI headers
        os.symlink("/usr/include", tmpd / "uapi")
        main = tmpd / "count.c"
        main.write_text(text)
        multiarch = Path("/usr/include") / f"{platform.machine()}-linux-gnu"
        # the same bytes from any checkout and temporary directory: paths in the debug info are mapped
        cmd = [clang, *FLAGS, f"-fdebug-prefix-map={tmpd}=/flowpulse", f"-fdebug-prefix-map={dp.BPF_DIR}=/flowpulse/bpf",
               f"-I{dp.BPF_DIR}", f"-I{tmpd}", f"-I{multiarch}",
               "-c", str(main), "-o", str(tmpd / "count.bpf.o")]
        got = subprocess.run(cmd, capture_output=True, text=True)
        if got.returncode != 0:
            drift = drift_from(got.stderr)
            if drift:
                raise EnvironmentProblem(f"datapath.py and bpf/switch.h disagree: {drift}: fix the mirror in "
                                         "netns_testbed/datapath.py or the header")
            raise EnvironmentProblem(f"clang could not build the counting object:\n{got.stderr.strip()}")
        if got.stderr.strip():
            log.info("clang said:\n%s", got.stderr.strip())
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmpd / "count.bpf.o", out)
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    stamp_path(out).write_text(json.dumps({"source_sha256": source_digest(), "clang": version}, indent=1) + "\n")
    return out


def check_current(obj: Path = OBJECT) -> None:
    """Refuse a missing object, or one built from other sources than these."""
    if not obj.is_file():
        raise EnvironmentProblem(f"the counting object {obj} is not built: {REBUILD} "
                                 "(or set counters: ebpf-bcc in the site file to compile it here with BCC)")
    try:
        stamp = json.loads(stamp_path(obj).read_text())
        built_from = stamp["source_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EnvironmentProblem(f"{obj} has no readable stamp ({stamp_path(obj).name}): rebuild it: {REBUILD}") \
            from None
    if built_from != source_digest():
        raise EnvironmentProblem(f"{obj} was built from other sources than this checkout's bpf/count.c: "
                                 f"rebuild it: {REBUILD}")


@contextlib.contextmanager
def _libbpf_messages(what: str):
    """libbpf prints its warnings (a verifier's refusal among them) on file descriptor 2: collected into
    log records, also when the call fails."""
    got = None
    try:
        with dp.fd2_captured() as got:
            yield
    finally:
        if got is not None and got.text.strip():
            log.info("libbpf (%s) said:\n%s", what, got.text.strip())


@lru_cache(maxsize=1)
def _object_api() -> ct.CDLL:
    """libbpf with the object loader's signatures declared (opaque handles: nothing is mirrored)."""
    lib = libbpf()
    for fn in ("bpf_object__open_file", "bpf_object__find_map_by_name", "bpf_object__find_program_by_name",
               "bpf_object__next_map"):
        getattr(lib, fn).restype = ct.c_void_p
    lib.bpf_map__name.restype = ct.c_char_p
    lib.bpf_object__open_file.argtypes = [ct.c_char_p, ct.c_void_p]
    for fn in ("bpf_object__find_map_by_name", "bpf_object__find_program_by_name"):
        getattr(lib, fn).argtypes = [ct.c_void_p, ct.c_char_p]
    lib.bpf_object__next_map.argtypes = [ct.c_void_p, ct.c_void_p]
    lib.bpf_map__name.argtypes = [ct.c_void_p]
    for fn in ("bpf_map__fd", "bpf_program__fd", "bpf_object__load"):
        getattr(lib, fn).argtypes = [ct.c_void_p]
    lib.bpf_map__set_max_entries.argtypes = [ct.c_void_p, ct.c_uint32]
    lib.bpf_map__set_initial_value.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t]
    lib.bpf_object__close.argtypes = [ct.c_void_p]
    lib.bpf_object__close.restype = None
    return lib


class CountingObject:
    """count.bpf.o opened, sized for one site's shape, loaded (verified) into the kernel.

    :meth:`map_fd` and :meth:`prog_fd` hand out the descriptors libbpf holds; :meth:`close` releases
    them (and with them the maps and programs, once nothing attached holds them)."""

    def __init__(self, shape: dp.SwitchShape, obj: Path = OBJECT) -> None:
        check_current(obj)
        lib = _object_api()
        self.lib = lib
        self.shape = shape
        with _libbpf_messages("open"):
            self.obj = lib.bpf_object__open_file(str(obj).encode(), None)
        if not self.obj:
            err = ct.get_errno() or 22
            raise EnvironmentProblem(f"libbpf cannot open {obj} ({os.strerror(err)}): rebuild it: {REBUILD}")
        try:
            self._size()
            with _libbpf_messages("load"):
                ret = lib.bpf_object__load(self.obj)
            if ret < 0:
                raise EnvironmentProblem(
                    f"the kernel refused the counting object ({os.strerror(-ret)}; libbpf's log above at -v): "
                    "it needs BPF ring buffers (5.8+), BTF-defined maps and tc clsact or tcx")
        except BaseException:
            self.close()
            raise

    def _map(self, name: str) -> int:
        m = self.lib.bpf_object__find_map_by_name(self.obj, f"{name}__map".encode())
        if not m:
            raise EnvironmentProblem(f"the counting object has no map {name!r}: rebuild it: {REBUILD}")
        return m

    def _size(self) -> None:
        """The shape-dependent sizes (the readers' own table) and the shape in .rodata."""
        for name, (_t, n, _pc) in dp.counter_map_entries(self.shape).items():
            _call("bpf_map__set_max_entries", self._map(name), ct.c_uint32(n))
        rodata = None
        m = self.lib.bpf_object__next_map(self.obj, None)
        while m:
            if self.lib.bpf_map__name(m).endswith(b".rodata"):
                rodata = m
            m = self.lib.bpf_object__next_map(self.obj, m)
        if rodata is None:
            raise EnvironmentProblem(f"the counting object has no .rodata (its {RODATA_SHAPE}): rebuild it: {REBUILD}")
        value = dp.Shape(self.shape.port_slots, self.shape.nsrc)
        # libbpf refuses a value whose size is not the section's: .rodata must hold fp_shape alone
        _call("bpf_map__set_initial_value", rodata, ct.byref(value), ct.sizeof(value))

    def map_fd(self, name: str) -> int:
        return _call("bpf_map__fd", self._map(name))

    def prog_fd(self, name: str) -> int:
        p = self.lib.bpf_object__find_program_by_name(self.obj, name.encode())
        if not p:
            raise EnvironmentProblem(f"the counting object has no program {name!r}: rebuild it: {REBUILD}")
        return _call("bpf_program__fd", p)

    def close(self) -> None:
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m netns_testbed.bpfobject",
        description="Build the site agent's counting object (bpf/count.c -> bpf/count.bpf.o) with clang.",
        epilog="examples:\n  python -m netns_testbed.bpfobject            # build it beside the sources\n"
               "  python -m netns_testbed.bpfobject --check    # exit 0 if current, 3 if missing or stale\n"
               "  python -m netns_testbed.bpfobject --out /tmp/count.bpf.o",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OBJECT, help=f"where to write the object (default {OBJECT})")
    ap.add_argument("--check", action="store_true", help="only say whether the object is current")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        if args.check:
            check_current(args.out)
            print(f"{args.out}: current")
        else:
            print(build(args.out))
    except EnvironmentProblem as e:
        print(f"flowpulse: {e}", file=sys.stderr)
        return int(ExitCode.ENVIRONMENT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
