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
from functools import lru_cache

_SYS_BPF = 321  # x86_64
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
    ret = _libc.syscall(_SYS_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
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
        """Per-CPU values are summed field by field (counters) into one structure."""
        out = []
        for i in range(n):
            base = i * self._stride * self.ncpu
            if not self.percpu:
                out.append(self.value_type.from_buffer_copy(buf, base))
                continue
            total = self.value_type()
            for c in range(self.ncpu):
                v = self.value_type.from_buffer_copy(buf, base + c * self._stride)
                for name, _ in self.value_type._fields_:
                    setattr(total, name, getattr(total, name) + getattr(v, name))
            out.append(total)
        return out

    def get(self, index: int):
        key = ct.c_uint32(index)
        buf = self._buf(1)
        _bpf(BPF_MAP_LOOKUP_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(key), value=ct.addressof(buf)))
        return self._values(buf, 1)[0]

    def set(self, index: int, value: ct.Structure) -> None:
        """Write one element (on a per-CPU map, the same value on every CPU)."""
        key = ct.c_uint32(index)
        buf = self._buf(1)
        raw = bytes(value)
        for c in range(self.ncpu):
            ct.memmove(ct.addressof(buf) + c * self._stride, raw, len(raw))
        _bpf(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(key), value=ct.addressof(buf)))

    def get_all(self) -> list:
        """All elements in one batch syscall (per-CPU values summed)."""
        n = self.entries
        keys = (ct.c_uint32 * n)()
        buf = self._buf(n)
        out_batch = ct.c_uint32(0)
        attr = _BatchAttr(in_batch=0, out_batch=ct.addressof(out_batch), keys=ct.addressof(keys),
                          values=ct.addressof(buf), count=n, map_fd=self.fd)
        try:
            _bpf(BPF_MAP_LOOKUP_BATCH, attr)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: the batch reached the end, values are filled
                raise
        if attr.count != n:
            raise OSError(errno.EIO, f"batch read of {self.path} returned {attr.count} of {n} entries")
        return self._values(buf, n)


class PinnedHash:
    """A pinned BPF hash map with u32 keys and u32 values (ifindex -> port)."""

    def __init__(self, path: str) -> None:
        p = ct.create_string_buffer(path.encode())
        self.fd = _bpf(BPF_OBJ_GET, _ObjAttr(pathname=ct.addressof(p)))

    def set(self, key: int, value: int) -> None:
        k, v = ct.c_uint32(key), ct.c_uint32(value)
        _bpf(BPF_MAP_UPDATE_ELEM, _ElemAttr(map_fd=self.fd, key=ct.addressof(k), value=ct.addressof(v)))

    def close(self) -> None:
        os.close(self.fd)


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
