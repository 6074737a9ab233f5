"""Pinned BPF maps and programs, through libbpf's low-level API (``libbpf.so.1``, ctypes).

Why not BCC here: the loader (datapath.py) uses BCC to compile, but readers (CLI, agents) only need a
handful of map and program operations. libbpf's ``bpf_*`` functions make the bpf(2) calls (its syscall
number, its ``union bpf_attr`` for the running kernel's commands) and the agents stay free of
LLVM/libbcc (tens of MB resident per switch). Debian ships libbpf in ``libbpf1`` (a dependency of
iproute2 and of BCC).

What is mirrored here is libbpf's own option structs (each starts with its size, ``sz``, so libbpf
reads no field past what this side knows) and the heads of two kernel structs libbpf hands back as they
are (``bpf_map_info``, ``bpf_prog_info``); tests/test_libbpf_abi.py compiles every offset and size
against libbpf's and the kernel's headers, so a drift fails there.
"""
from __future__ import annotations

import ctypes as ct
import ctypes.util
import errno
import os
from functools import lru_cache

import numpy as np

BPF_F_RDONLY = 1 << 3     # bpf_obj_get_opts file_flags: a descriptor that can read the map, not change it
BPF_ANY = 0               # bpf_map_update_elem flags: create or replace


@lru_cache(maxsize=1)
def libbpf() -> ct.CDLL:
    """libbpf, loaded once (EnvironmentProblem when the machine has none)."""
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ct.CDLL(name, use_errno=True)
    except OSError:
        from netns_testbed.errors import EnvironmentProblem
        raise EnvironmentProblem("libbpf is not installed (the agents read BPF maps through it): "
                                 "apt-get install libbpf1") from None
    return lib


def _call(fn: str, *args) -> int:
    """A libbpf call that returns a descriptor, a count or 0: a negative return is -errno (libbpf 1.0+)."""
    ret = getattr(libbpf(), fn)(*args)
    if ret < 0:
        err = -ret if ret != -1 else (ct.get_errno() or errno.EINVAL)
        raise OSError(err, f"{fn}: {os.strerror(err)}")
    return ret


def map_update(fd: int, key: ct._SimpleCData | ct.Structure, value: ct._SimpleCData | ct.Structure) -> None:
    """Create or replace one element of a (not per-CPU) map: ``key`` and ``value`` laid out as the map's."""
    _call("bpf_map_update_elem", fd, ct.byref(key), ct.byref(value), ct.c_uint64(BPF_ANY))


class ObjGetOpts(ct.Structure):      # struct bpf_obj_get_opts (libbpf 1.0+)
    _fields_ = [("sz", ct.c_size_t), ("file_flags", ct.c_uint32)]


class MapCreateOpts(ct.Structure):   # struct bpf_map_create_opts (libbpf 0.7+)
    _fields_ = [("sz", ct.c_size_t), ("btf_fd", ct.c_uint32), ("btf_key_type_id", ct.c_uint32),
                ("btf_value_type_id", ct.c_uint32), ("btf_vmlinux_value_type_id", ct.c_uint32),
                ("inner_map_fd", ct.c_uint32), ("map_flags", ct.c_uint32), ("map_extra", ct.c_uint64),
                ("numa_node", ct.c_uint32), ("map_ifindex", ct.c_uint32)]


class ProgLoadOpts(ct.Structure):    # struct bpf_prog_load_opts (libbpf 0.7+)
    _fields_ = [("sz", ct.c_size_t), ("attempts", ct.c_int), ("expected_attach_type", ct.c_uint32),
                ("prog_btf_fd", ct.c_uint32), ("prog_flags", ct.c_uint32), ("prog_ifindex", ct.c_uint32),
                ("kern_version", ct.c_uint32), ("attach_btf_id", ct.c_uint32), ("attach_prog_fd", ct.c_uint32),
                ("attach_btf_obj_fd", ct.c_uint32), ("fd_array", ct.c_void_p), ("func_info", ct.c_void_p),
                ("func_info_cnt", ct.c_uint32), ("func_info_rec_size", ct.c_uint32), ("line_info", ct.c_void_p),
                ("line_info_cnt", ct.c_uint32), ("line_info_rec_size", ct.c_uint32), ("log_level", ct.c_uint32),
                ("log_size", ct.c_uint32), ("log_buf", ct.c_void_p)]


class TestRunOpts(ct.Structure):     # struct bpf_test_run_opts (libbpf 0.3+)
    __test__ = False     # not a pytest test class
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32), ("ctx_in", ct.c_void_p),
                ("ctx_out", ct.c_void_p), ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32), ("flags", ct.c_uint32),
                ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


class LinkCreateOpts(ct.Structure):  # struct bpf_link_create_opts, up to its flags (libbpf 0.0.8+)
    _fields_ = [("sz", ct.c_size_t), ("flags", ct.c_uint32)]


class ProgQueryOpts(ct.Structure):   # struct bpf_prog_query_opts (libbpf 1.0+)
    _fields_ = [("sz", ct.c_size_t), ("query_flags", ct.c_uint32), ("attach_flags", ct.c_uint32),
                ("prog_ids", ct.c_void_p), ("prog_cnt", ct.c_uint32), ("prog_attach_flags", ct.c_void_p)]


class MapInfo(ct.Structure):         # the head of the kernel's struct bpf_map_info
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("key_size", ct.c_uint32),
                ("value_size", ct.c_uint32), ("max_entries", ct.c_uint32), ("map_flags", ct.c_uint32),
                ("name", ct.c_char * 16)]


class ProgInfo(ct.Structure):        # the head of the kernel's struct bpf_prog_info, up to its name
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("tag", ct.c_uint8 * 8), ("jited_prog_len", ct.c_uint32),
                ("xlated_prog_len", ct.c_uint32), ("jited_prog_insns", ct.c_uint64),
                ("xlated_prog_insns", ct.c_uint64), ("load_time", ct.c_uint64), ("created_by_uid", ct.c_uint32),
                ("nr_map_ids", ct.c_uint32), ("map_ids", ct.c_uint64), ("name", ct.c_char * 16)]


def _opts(cls: type[ct.Structure], **fields) -> ct.Structure:
    return cls(sz=ct.sizeof(cls), **fields)


def _obj_get(path: str, flags: int = 0) -> int:
    return _call("bpf_obj_get_opts", path.encode(), ct.byref(_opts(ObjGetOpts, file_flags=flags)))


@lru_cache(maxsize=1)
def possible_cpus() -> int:
    """Number of possible CPUs: per-CPU map values hold one slot for each."""
    return _call("libbpf_num_possible_cpus")


def obj_pin(fd: int, path: str) -> None:
    _call("bpf_obj_pin", fd, path.encode())


class PinnedArray:
    """A pinned BPF array map of ctypes structures (plain or per-CPU)."""

    def __init__(self, path: str, value_type: type, entries: int, percpu: bool = False, fd: int | None = None,
                 readonly: bool = False) -> None:
        """Open the map pinned at ``path`` (``readonly``: a descriptor the kernel refuses writes through),
        or (``fd``) a copy of a map descriptor this process holds."""
        if fd is not None:
            self.fd = os.dup(fd)
        else:
            try:
                self.fd = _obj_get(path, BPF_F_RDONLY if readonly else 0)
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
        _call("bpf_map_lookup_elem", self.fd, ct.byref(key), ct.byref(buf))
        return self._values(buf, 1)[0]

    def _update_raw(self, index: int, raw: ct.Array) -> None:
        """Write one element from a buffer laid out as the kernel wants it (each CPU's value)."""
        key = ct.c_uint32(index)
        _call("bpf_map_update_elem", self.fd, ct.byref(key), ct.byref(raw), ct.c_uint64(BPF_ANY))

    def set(self, index: int, value: ct.Structure) -> None:
        """Write one element (on a per-CPU map, the same value on every CPU)."""
        key = ct.c_uint32(index)
        buf = self._buf(1)
        raw = bytes(value)
        for c in range(self.ncpu):
            ct.memmove(ct.addressof(buf) + c * self._stride, raw, len(raw))
        _call("bpf_map_update_elem", self.fd, ct.byref(key), ct.byref(buf), ct.c_uint64(BPF_ANY))

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
        count = ct.c_uint32(n)
        try:
            _call("bpf_map_lookup_batch", self.fd, ct.byref(prev) if first else None, ct.byref(out_batch),
                  ct.byref(keys), ct.byref(buf), ct.byref(count), None)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the batch reached the end, values are filled
                raise
        if count.value != n or keys[0] != first:
            raise OSError(errno.EIO, f"batch read of {self.path} returned {count.value} of {n} entries from {keys[0]}")
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


def loaded_program_names() -> list[str]:
    """Names of all BPF programs loaded in the kernel (what ``bpftool prog`` lists)."""
    return list(loaded_programs().values())


def loaded_programs() -> dict[int, str]:
    """Id -> name of every BPF program loaded in the kernel."""
    names, cur = {}, 0
    while True:
        nxt = ct.c_uint32(0)
        try:
            _call("bpf_prog_get_next_id", ct.c_uint32(cur), ct.byref(nxt))
        except OSError as e:
            if e.errno == errno.ENOENT:
                return names
            raise
        cur = nxt.value
        try:
            fd = _call("bpf_prog_get_fd_by_id", ct.c_uint32(cur))
        except OSError:
            continue            # unloaded in between
        try:
            info, size = ProgInfo(), ct.c_uint32(ct.sizeof(ProgInfo))
            _call("bpf_obj_get_info_by_fd", fd, ct.byref(info), ct.byref(size))
            names[cur] = info.name.decode(errors="replace")
        finally:
            os.close(fd)


def _test_run(prog_fd: int, frame: bytes, repeat: int) -> tuple[TestRunOpts, ct.Array]:
    data_in = ct.create_string_buffer(frame, len(frame))
    data_out = ct.create_string_buffer(len(frame) + 256)
    opts = _opts(TestRunOpts, data_in=ct.addressof(data_in), data_out=ct.addressof(data_out),
                 data_size_in=len(frame), data_size_out=len(data_out), repeat=repeat)
    _call("bpf_prog_test_run_opts", prog_fd, ct.byref(opts))
    return opts, data_out


def prog_test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> tuple[int, bytes]:
    """Run a loaded tc program on ``frame`` (Ethernet onwards) in the kernel, without attaching it
    (BPF_PROG_TEST_RUN): ``repeat`` runs on the same buffer; returns the last run's verdict and the
    frame as the program left it. The packet's device is this namespace's loopback (ifindex 1)."""
    opts, data_out = _test_run(prog_fd, frame, repeat)
    return ct.c_int32(opts.retval).value, data_out.raw[:opts.data_size_out]


def prog_test_time(prog_fd: int, frame: bytes, repeat: int) -> int:
    """The kernel's mean time (ns) of one of ``repeat`` runs of a tc program on ``frame`` (as
    :func:`prog_test_run`, timed by BPF_PROG_TEST_RUN itself)."""
    opts, _ = _test_run(prog_fd, frame, repeat)
    return opts.duration


# -- copies of a compiled program: one compile, one set of maps and programs per switch ------------
BPF_PROG_TYPE_SCHED_CLS = 3    # enum bpf_prog_type
BPF_PSEUDO_MAP_FD = 1
BPF_LD_IMM64 = 0x18       # BPF_LD | BPF_IMM | BPF_DW: a 64-bit immediate over two instructions


class MapSpec(tuple):
    """(type, key size, value size, entries, flags, name) of a map, enough to create another like it."""

    __slots__ = ()

    def __new__(cls, map_type: int, key_size: int, value_size: int, max_entries: int, flags: int, name: bytes):
        return super().__new__(cls, (map_type, key_size, value_size, max_entries, flags, name))


def map_spec(fd: int) -> MapSpec:
    """What the kernel says of the map behind ``fd`` (BPF_OBJ_GET_INFO_BY_FD)."""
    info, size = MapInfo(), ct.c_uint32(ct.sizeof(MapInfo))
    _call("bpf_obj_get_info_by_fd", fd, ct.byref(info), ct.byref(size))
    return MapSpec(info.type, info.key_size, info.value_size, info.max_entries, info.map_flags, info.name)


def map_create(spec: MapSpec) -> int:
    """A new, empty map like ``spec`` (BPF_MAP_CREATE); returns its descriptor."""
    t, k, v, n, flags, name = spec
    return _call("bpf_map_create", t, name[:15], k, v, n, ct.byref(_opts(MapCreateOpts, map_flags=flags)))


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

    def load(opts: ProgLoadOpts) -> int:
        return _call("bpf_prog_load", prog_type, name.encode()[:15], license, code, ct.c_size_t(len(insns) // 8),
                     ct.byref(opts))

    try:
        return load(_opts(ProgLoadOpts))
    except OSError as e:
        log = ct.create_string_buffer(1 << 20)
        try:
            return load(_opts(ProgLoadOpts, log_level=1, log_size=len(log), log_buf=ct.addressof(log)))
        except OSError:          # (a passing retry loads after all: use it)
            tail = " | ".join(log.value.decode(errors="replace").strip().splitlines()[-3:])
            raise OSError(e.errno, f"loading {name}: {os.strerror(e.errno)}: {tail}") from None


# -- tcx links (kernel 6.6+): a program attached to a port's ingress or egress by a BPF link ------------
BPF_TCX_INGRESS = 46       # enum bpf_attach_type, 6.6+ UAPI (tests/test_fabric.py attaches and queries with them)
BPF_TCX_EGRESS = 47
BPF_F_BEFORE = 1 << 3      # mprog attach flags: with no relative program, in front of every other


def link_create_tcx(prog_fd: int, ifindex: int, attach_type: int, flags: int = 0) -> int:
    """Attach ``prog_fd`` to ``ifindex`` (in the calling thread's network namespace) with a tcx link;
    returns the link's descriptor: the program stays attached while it (or a pin of it) lives."""
    return _call("bpf_link_create", prog_fd, ifindex, attach_type, ct.byref(_opts(LinkCreateOpts, flags=flags)))


def tcx_program_ids(ifindex: int, attach_type: int) -> list[int]:
    """Ids of the programs tcx runs on ``ifindex`` (calling thread's namespace), in the order they run."""
    ids = (ct.c_uint32 * 64)()
    opts = _opts(ProgQueryOpts, prog_ids=ct.addressof(ids), prog_cnt=64)
    _call("bpf_prog_query_opts", ifindex, attach_type, ct.byref(opts))
    return list(ids[:opts.prog_cnt])


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


_SAMPLE_FN = ct.CFUNCTYPE(ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_size_t)   # ring_buffer_sample_fn


@lru_cache(maxsize=1)
def _ring_buffer_new():
    fn = libbpf().ring_buffer__new
    fn.restype = ct.c_void_p
    return fn


class RingWakeups:
    """The kernel's "a pulse opened" signal: a BPF ring buffer (``BPF_MAP_TYPE_RINGBUF``, Linux 5.8+) read
    through libbpf's ``ring_buffer``, whose epoll descriptor is readable while records wait. Only the
    wake-up is used, not the records: after a wake the reader consumes them (:meth:`drain`), which re-arms
    it."""

    def __init__(self, path: str | None = None, fd: int | None = None) -> None:
        if fd is not None:
            self.fd = os.dup(fd)
        else:
            try:
                self.fd = _obj_get(path)
            except OSError as e:
                raise FileNotFoundError(errno.ENOENT, f"no pinned BPF ring buffer at {path} ({e.strerror})") from None
        self._count = 0
        self._sample = _SAMPLE_FN(self._on_record)       # kept: libbpf calls it from ring_buffer__consume
        self._rb = _ring_buffer_new()(self.fd, self._sample, None, None)
        if not self._rb:
            err = ct.get_errno() or errno.EINVAL
            os.close(self.fd)
            raise OSError(err, f"ring_buffer__new: {os.strerror(err)}")
        self._epoll_fd = _call("ring_buffer__epoll_fd", ct.c_void_p(self._rb))    # the ring's own: lives as long

    def _on_record(self, ctx, data, size) -> int:
        self._count += 1
        return 0

    def fileno(self) -> int:
        """libbpf's epoll descriptor of the ring: readable while records wait."""
        return self._epoll_fd

    def drain(self) -> int:
        """Take every waiting record (unread: the wake-up was the message); returns how many there were."""
        self._count = 0
        _call("ring_buffer__consume", ct.c_void_p(self._rb))
        return self._count

    def close(self) -> None:
        if self.fd >= 0:
            libbpf().ring_buffer__free(ct.c_void_p(self._rb))
            os.close(self.fd)
            self.fd = -1
