"""Pinned BPF maps read and written through the bpf(2) syscall.

Why not BCC here: the loader (datapath.py) uses BCC to compile, but readers
(CLI, agents) only need a handful of map operations on pinned maps. Doing those
with the raw syscall keeps each agent free of LLVM/libbcc (tens of MB resident
per switch) and lets it run where BCC is absent. The ABI used is the stable
``union bpf_attr`` layout of include/uapi/linux/bpf.h.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
import sys
from functools import lru_cache

import numpy as np

# bpf(2)'s number differs per architecture (arch/*/include/uapi/asm/unistd*.h, syscall.tbl)
SYS_BPF_BY_MACHINE = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280,
                      "loongarch64": 280, "ppc64le": 361, "ppc64": 361, "s390x": 351,
                      "i386": 357, "i686": 357, "armv7l": 386, "armv6l": 386, "mips64": 5315}


def sys_bpf_number(machine: str | None = None) -> int:
    """The bpf(2) system call's number on this machine's architecture."""
    m = machine or platform.machine()
    try:
        return SYS_BPF_BY_MACHINE[m]
    except KeyError:
        from netns_testbed.errors import EnvironmentProblem
        raise EnvironmentProblem(f"no bpf(2) syscall number known for architecture {m!r}: add it to "
                                 "SYS_BPF_BY_MACHINE in netns_testbed/bpfmaps.py") from None


@lru_cache(maxsize=1)
def _sys_bpf() -> int:
    return sys_bpf_number()


BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_MAP_LOOKUP_BATCH = 24
BPF_F_RDONLY = 1 << 3     # BPF_OBJ_GET file_flags: a descriptor that can read the map, not change it

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


class _ElemAttr(ct.Structure):
    _fields_ = [("map_fd", ct.c_uint32), ("pad", ct.c_uint32), ("key", ct.c_uint64),
                ("value", ct.c_uint64), ("flags", ct.c_uint64)]


class _ObjAttr(ct.Structure):
    _fields_ = [("pathname", ct.c_uint64), ("bpf_fd", ct.c_uint32), ("file_flags", ct.c_uint32),
                ("path_fd", ct.c_int32), ("pad", ct.c_uint32)]


class _BatchAttr(ct.Structure):
    _fields_ = [("in_batch", ct.c_uint64), ("out_batch", ct.c_uint64), ("keys", ct.c_uint64),
                ("values", ct.c_uint64), ("count", ct.c_uint32), ("map_fd", ct.c_uint32),
                ("elem_flags", ct.c_uint64), ("flags", ct.c_uint64)]


def _bpf(cmd: int, attr: ct.Structure) -> int:
    ret = _libc.syscall(_sys_bpf(), cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return ret


@lru_cache(maxsize=1)
def possible_cpus() -> int:
    """Number of possible CPUs: per-CPU map values hold one slot for each."""
    text = open("/sys/devices/system/cpu/possible").read().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def obj_pin(fd: int, path: str) -> None:
    p = ct.create_string_buffer(path.encode())
    _bpf(BPF_OBJ_PIN, _ObjAttr(pathname=ct.addressof(p), bpf_fd=fd))


class PinnedArray:
    """A pinned BPF array map of ctypes structures (plain or per-CPU)."""

    def __init__(self, path: str, value_type: type, entries: int, percpu: bool = False, fd: int | None = None,
                 readonly: bool = False) -> None:
        """Open the map pinned at ``path`` (``readonly``: a descriptor the kernel refuses writes through),
        or (``fd``) a copy of a map descriptor this process holds."""
        if fd is not None:
            self.fd = os.dup(fd)
        else:
            p = ct.create_string_buffer(path.encode())
            try:
                self.fd = _bpf(BPF_OBJ_GET, _ObjAttr(pathname=ct.addressof(p),
                                                     file_flags=BPF_F_RDONLY if readonly else 0))
            except OSError as e:
                raise FileNotFoundError(errno.ENOENT, f"no pinned BPF map at {path} ({e.strerror})") from None
        self.path = path
        self.value_type = value_type
        self.entries = entries
        self.percpu = percpu
        self.ncpu = possible_cpus() if percpu else 1
        self._stride = (ct.sizeof(value_type) + 7) // 8 * 8 if percpu else ct.sizeof(value_type)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "PinnedArray":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _buf(self, n: int) -> ct.Array:
        return (ct.c_char * (self._stride * self.ncpu * n))()

    def _values(self, buf: ct.Array, n: int) -> list:
        """Elements as ``value_type`` structures, per-CPU values summed field by field."""
        if not self.percpu:
            return [self.value_type.from_buffer_copy(buf, i * self._stride) for i in range(n)]
        summed = self._summed(buf, n)
        return [self.value_type.from_buffer_copy(summed, i * ct.sizeof(self.value_type)) for i in range(n)]

    def _summed(self, buf: ct.Array, n: int) -> np.ndarray:
        """Per-CPU values summed over the CPUs in numpy: a structured array of ``n`` elements.
        Every field of a per-CPU value FlowPulse keeps is an unsigned counter (wrapping sums)."""
        dt = _dtype(self.value_type)
        per_cpu = self._per_cpu(buf, n)
        out = np.zeros(n, dtype=dt)
        for name in dt.names:
            out[name] = per_cpu[name].sum(axis=1, dtype=dt[name])
        return out

    def get_all_array(self) -> np.ndarray:
        """All elements in one batch syscall as a numpy structured array (per-CPU values summed):
        the fast read of counters (no Python object per element or per CPU)."""
        buf = self._batch()
        if self.percpu:
            return self._summed(buf, self.entries)
        return np.frombuffer(buf, dtype=_dtype(self.value_type), count=self.entries).copy()

    def get_range_per_cpu(self, first: int, n: int) -> np.ndarray:
        """Elements ``first`` .. ``first + n - 1`` of a per-CPU map, each CPU's value apart: a
        structured array [n, ncpu] (one batch syscall)."""
        return self._per_cpu(self._batch(first, n), n)

    def _per_cpu(self, buf: ct.Array, n: int) -> np.ndarray:
        """A batch buffer of ``n`` per-CPU elements as a structured array [n, ncpu]."""
        dt = _dtype(self.value_type)
        if dt.itemsize == self._stride:            # no padding between CPUs' values: view it as it is
            return np.frombuffer(buf, dtype=dt, count=n * self.ncpu).reshape(n, self.ncpu)
        raw = np.frombuffer(buf, dtype=np.uint8, count=n * self.ncpu * self._stride)
        return raw.reshape(n, self.ncpu, self._stride)[:, :, :dt.itemsize].copy().view(dt)[..., 0]

    def get(self, index: int):
        key = ct.c_uint32(index)
        buf = self._buf(1)
        _bpf(BPF_MAP_LOOKUP_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(key), value=ct.addressof(buf)))
        return self._values(buf, 1)[0]

    def _update_raw(self, index: int, raw: ct.Array) -> None:
        """Write one element from a buffer laid out as the kernel wants it (each CPU's value)."""
        key = ct.c_uint32(index)
        _bpf(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(key), value=ct.addressof(raw)))

    def set(self, index: int, value: ct.Structure) -> None:
        """Write one element (on a per-CPU map, the same value on every CPU)."""
        key = ct.c_uint32(index)
        buf = self._buf(1)
        raw = bytes(value)
        for c in range(self.ncpu):
            ct.memmove(ct.addressof(buf) + c * self._stride, raw, len(raw))
        _bpf(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(key), value=ct.addressof(buf)))

    def _batch(self, first: int = 0, n: int | None = None) -> ct.Array:
        """The raw values (all CPUs) of elements ``first`` .. ``first + n - 1`` (default: all) in one
        BPF_MAP_LOOKUP_BATCH (the kernel starts after the key given as in_batch)."""
        n = self.entries - first if n is None else n
        if first < 0 or n <= 0 or first + n > self.entries:
            raise ValueError(f"elements {first}..{first + n - 1} are not in {self.path} ({self.entries} entries)")
        keys = (ct.c_uint32 * n)()
        buf = self._buf(n)
        out_batch = ct.c_uint32(0)
        prev = ct.c_uint32(first - 1)
        attr = _BatchAttr(in_batch=ct.addressof(prev) if first else 0, out_batch=ct.addressof(out_batch),
                          keys=ct.addressof(keys), values=ct.addressof(buf), count=n, map_fd=self.fd)
        try:
            _bpf(BPF_MAP_LOOKUP_BATCH, attr)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the batch reached the end, values are filled
                raise
        if attr.count != n or keys[0] != first:
            raise OSError(errno.EIO, f"batch read of {self.path} returned {attr.count} of {n} entries from {keys[0]}")
        return buf

    def get_all(self) -> list:
        """All elements in one batch syscall (per-CPU values summed)."""
        return self._values(self._batch(), self.entries)


_CT_TO_NP = {ct.c_uint8: np.uint8, ct.c_uint16: np.uint16, ct.c_uint32: np.uint32, ct.c_uint64: np.uint64,
             ct.c_int32: np.int32, ct.c_int64: np.int64}


@lru_cache(maxsize=None)
def _dtype(value_type: type) -> np.dtype:
    """The numpy dtype of a ctypes structure of integer fields (and arrays of them), same layout."""
    names, formats, offsets = [], [], []
    for name, t in value_type._fields_:
        f = getattr(value_type, name)
        if issubclass(t, ct.Array):
            fmt = (_CT_TO_NP[t._type_], t._length_)
        else:
            fmt = _CT_TO_NP[t]
        names.append(name)
        formats.append(fmt)
        offsets.append(f.offset)
    dt = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ct.sizeof(value_type)})
    return dt


BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15


class _NextIdAttr(ct.Structure):
    _fields_ = [("start_id", ct.c_uint32), ("next_id", ct.c_uint32), ("open_flags", ct.c_uint32)]


class _InfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]


def loaded_program_names() -> list[str]:
    """Names of all BPF programs loaded in the kernel (what ``bpftool prog`` lists)."""
    return list(loaded_programs().values())


def loaded_programs() -> dict[int, str]:
    """Id -> name of every BPF program loaded in the kernel."""
    names, cur = {}, 0
    while True:
        attr = _NextIdAttr(start_id=cur)
        try:
            _bpf(BPF_PROG_GET_NEXT_ID, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return names
            raise
        cur = attr.next_id
        try:
            fd = _bpf(BPF_PROG_GET_FD_BY_ID, _NextIdAttr(start_id=cur))
        except OSError:
            continue
        try:
            info = (ct.c_uint8 * 256)()
            _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=256, info=ct.addressof(info)))
            # struct bpf_prog_info: name[16] starts at byte offset 64
            names[cur] = bytes(info[64:80]).split(b"\0")[0].decode(errors="replace")
        finally:
            os.close(fd)


BPF_PROG_TEST_RUN = 10


class _TestRunAttr(ct.Structure):
    _fields_ = [("prog_fd", ct.c_uint32), ("retval", ct.c_uint32), ("data_size_in", ct.c_uint32),
                ("data_size_out", ct.c_uint32), ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
                ("repeat", ct.c_uint32), ("duration", ct.c_uint32), ("ctx_size_in", ct.c_uint32),
                ("ctx_size_out", ct.c_uint32), ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32), ("pad", ct.c_uint32)]


def _test_run(prog_fd: int, frame: bytes, repeat: int) -> tuple[_TestRunAttr, ct.Array]:
    data_in = ct.create_string_buffer(frame, len(frame))
    data_out = ct.create_string_buffer(len(frame) + 256)
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(frame), data_size_out=len(data_out),
                        data_in=ct.addressof(data_in), data_out=ct.addressof(data_out), repeat=repeat)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return attr, data_out


def prog_test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> tuple[int, bytes]:
    """Run a loaded tc program on ``frame`` (Ethernet onwards) in the kernel, without attaching it
    (BPF_PROG_TEST_RUN): ``repeat`` runs on the same buffer; returns the last run's verdict and the
    frame as the program left it. The packet's device is this namespace's loopback (ifindex 1)."""
    attr, data_out = _test_run(prog_fd, frame, repeat)
    return ct.c_int32(attr.retval).value, data_out.raw[:attr.data_size_out]


def prog_test_time(prog_fd: int, frame: bytes, repeat: int) -> int:
    """The kernel's mean time (ns) of one of ``repeat`` runs of a tc program on ``frame`` (as
    :func:`prog_test_run`, timed by BPF_PROG_TEST_RUN itself)."""
    attr, _ = _test_run(prog_fd, frame, repeat)
    return attr.duration


# -- copies of a compiled program: one compile, one set of maps and programs per switch ------------
BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PSEUDO_MAP_FD = 1
BPF_LD_IMM64 = 0x18       # BPF_LD | BPF_IMM | BPF_DW: a 64-bit immediate over two instructions


class _MapInfo(ct.Structure):      # the head of struct bpf_map_info
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("key_size", ct.c_uint32),
                ("value_size", ct.c_uint32), ("max_entries", ct.c_uint32), ("map_flags", ct.c_uint32),
                ("name", ct.c_char * 16)]


class _MapCreateAttr(ct.Structure):
    _fields_ = [("map_type", ct.c_uint32), ("key_size", ct.c_uint32), ("value_size", ct.c_uint32),
                ("max_entries", ct.c_uint32), ("map_flags", ct.c_uint32), ("inner_map_fd", ct.c_uint32),
                ("numa_node", ct.c_uint32), ("map_name", ct.c_char * 16)]


class _ProgLoadAttr(ct.Structure):
    _fields_ = [("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
                ("license", ct.c_uint64), ("log_level", ct.c_uint32), ("log_size", ct.c_uint32),
                ("log_buf", ct.c_uint64), ("kern_version", ct.c_uint32), ("prog_flags", ct.c_uint32),
                ("prog_name", ct.c_char * 16)]


class MapSpec(tuple):
    """(type, key size, value size, entries, flags, name) of a map, enough to create another like it."""

    __slots__ = ()

    def __new__(cls, map_type: int, key_size: int, value_size: int, max_entries: int, flags: int, name: bytes):
        return super().__new__(cls, (map_type, key_size, value_size, max_entries, flags, name))


def map_spec(fd: int) -> MapSpec:
    """What the kernel says of the map behind ``fd`` (BPF_OBJ_GET_INFO_BY_FD)."""
    info = _MapInfo()
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=ct.sizeof(info), info=ct.addressof(info)))
    return MapSpec(info.type, info.key_size, info.value_size, info.max_entries, info.map_flags, info.name)


def map_create(spec: MapSpec) -> int:
    """A new, empty map like ``spec`` (BPF_MAP_CREATE); returns its descriptor."""
    t, k, v, n, flags, name = spec
    return _bpf(BPF_MAP_CREATE, _MapCreateAttr(map_type=t, key_size=k, value_size=v, max_entries=n,
                                               map_flags=flags, map_name=name[:15]))


def _imm64_loads(insns: bytes):
    """Offsets of the 64-bit immediate loads that name a map descriptor (BPF_PSEUDO_MAP_FD), walking
    the instructions in order (the second half of such a load is not an instruction of its own)."""
    i = 0
    while i + 8 <= len(insns):
        if insns[i] == BPF_LD_IMM64:
            if insns[i + 1] >> 4 == BPF_PSEUDO_MAP_FD:
                yield i
            i += 16
        else:
            i += 8


def map_fds_in(insns: bytes) -> list[int]:
    """The map descriptors a program's instructions load, each once, in order of first use."""
    out: list[int] = []
    for i in _imm64_loads(insns):
        fd = int.from_bytes(insns[i + 4:i + 8], "little", signed=True)
        if fd not in out:
            out.append(fd)
    return out


def patch_map_fds(insns: bytes, fds: dict[int, int]) -> bytes:
    """``insns`` with every map descriptor ``old`` that a 64-bit immediate load names replaced by
    ``fds[old]``; a descriptor missing from ``fds`` is a KeyError (the copy would use the template's map)."""
    out = bytearray(insns)
    for i in _imm64_loads(insns):
        old = int.from_bytes(insns[i + 4:i + 8], "little", signed=True)
        out[i + 4:i + 8] = fds[old].to_bytes(4, "little", signed=True)
    return bytes(out)


def prog_load(insns: bytes, name: str, license: bytes = b"GPL", prog_type: int = BPF_PROG_TYPE_SCHED_CLS) -> int:
    """Load ``insns`` as a program (BPF_PROG_LOAD); returns its descriptor. On a refusal, the
    OSError's message ends with the verifier's last lines."""
    code = ct.create_string_buffer(insns, len(insns))
    lic = ct.create_string_buffer(license)
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=len(insns) // 8, insns=ct.addressof(code),
                         license=ct.addressof(lic), prog_name=name.encode()[:15])
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        log = ct.create_string_buffer(1 << 20)
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ct.addressof(log)
        try:
            return _bpf(BPF_PROG_LOAD, attr)      # loads after all (a passing retry): use it
        except OSError:
            tail = " | ".join(log.value.decode(errors="replace").strip().splitlines()[-3:])
            raise OSError(e.errno, f"loading {name}: {os.strerror(e.errno)}: {tail}") from None


# -- tcx links (kernel 6.6+): a program attached to a port's ingress or egress by a BPF link ------------
BPF_PROG_QUERY = 16
BPF_LINK_CREATE = 28
BPF_TCX_INGRESS = 46       # enum bpf_attach_type, 6.6+ UAPI (tests/test_fabric.py attaches and queries with them)
BPF_TCX_EGRESS = 47
BPF_F_BEFORE = 1 << 3      # mprog attach flags: with no relative program, in front of every other


class _LinkCreateAttr(ct.Structure):    # link_create with its tcx member
    _fields_ = [("prog_fd", ct.c_uint32), ("target_ifindex", ct.c_uint32), ("attach_type", ct.c_uint32),
                ("flags", ct.c_uint32), ("relative_fd", ct.c_uint32), ("pad", ct.c_uint32),
                ("expected_revision", ct.c_uint64)]


class _QueryAttr(ct.Structure):         # the query member, up to its revision (6.6+)
    _fields_ = [("target_ifindex", ct.c_uint32), ("attach_type", ct.c_uint32), ("query_flags", ct.c_uint32),
                ("attach_flags", ct.c_uint32), ("prog_ids", ct.c_uint64), ("count", ct.c_uint32),
                ("pad", ct.c_uint32), ("prog_attach_flags", ct.c_uint64), ("link_ids", ct.c_uint64),
                ("link_attach_flags", ct.c_uint64), ("revision", ct.c_uint64)]


def link_create_tcx(prog_fd: int, ifindex: int, attach_type: int, flags: int = 0) -> int:
    """Attach ``prog_fd`` to ``ifindex`` (in the calling thread's network namespace) with a tcx link;
    returns the link's descriptor: the program stays attached while it (or a pin of it) lives."""
    return _bpf(BPF_LINK_CREATE, _LinkCreateAttr(prog_fd=prog_fd, target_ifindex=ifindex,
                                                 attach_type=attach_type, flags=flags))


def tcx_program_ids(ifindex: int, attach_type: int) -> list[int]:
    """Ids of the programs tcx runs on ``ifindex`` (calling thread's namespace), in the order they run."""
    ids = (ct.c_uint32 * 64)()
    attr = _QueryAttr(target_ifindex=ifindex, attach_type=attach_type, prog_ids=ct.addressof(ids), count=64)
    _bpf(BPF_PROG_QUERY, attr)
    return list(ids[:attr.count])


@lru_cache(maxsize=1)
def tcx_supported() -> bool:
    """Whether this kernel attaches tc programs with tcx links: a link to ifindex 0 fails with ENODEV
    where tcx exists and EINVAL where the attach type is unknown (before 6.6). Nothing is attached."""
    insns = bytes([0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])     # r0 = 0; exit
    fd = prog_load(insns, "fp_tcx_probe")
    try:
        os.close(link_create_tcx(fd, 0, BPF_TCX_INGRESS))     # (never: ifindex 0 is no device)
        return True
    except OSError as e:
        return e.errno == errno.ENODEV
    finally:
        os.close(fd)


class RingWakeups:
    """The kernel's "a pulse opened" signal: a BPF ring buffer (``BPF_MAP_TYPE_RINGBUF``, Linux 5.8+) whose
    descriptor epoll reports readable while records wait. Only the wake-up is used, not the records: after a
    wake the reader moves the consumer position to the producer's (:meth:`drain`), which re-arms it.

    The ring's first page (the consumer position) is mapped read-write and the second (the producer
    position) read-only, as the kernel lays them out (kernel/bpf/ringbuf.c)."""

    def __init__(self, path: str | None = None, fd: int | None = None) -> None:
        import mmap

        if fd is not None:
            self.fd = os.dup(fd)
        else:
            p = ct.create_string_buffer(path.encode())
            try:
                self.fd = _bpf(BPF_OBJ_GET, _ObjAttr(pathname=ct.addressof(p)))
            except OSError as e:
                raise FileNotFoundError(errno.ENOENT, f"no pinned BPF ring buffer at {path} ({e.strerror})") from None
        page = mmap.PAGESIZE
        try:
            self._cons = mmap.mmap(self.fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._prod = mmap.mmap(self.fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except BaseException:
            os.close(self.fd)
            raise

    def fileno(self) -> int:
        return self.fd

    def drain(self) -> int:
        """Take every waiting record (unread: the wake-up was the message); returns how many bytes were
        waiting."""
        prod = ct.c_uint64.from_buffer_copy(self._prod, 0).value
        cons = ct.c_uint64.from_buffer_copy(self._cons, 0).value
        if prod != cons:
            self._cons[0:8] = prod.to_bytes(8, sys.byteorder)
        return prod - cons

    def close(self) -> None:
        if self.fd >= 0:
            self._cons.close()
            self._prod.close()
            os.close(self.fd)
            self.fd = -1
