"""netns_testbed/bpfmaps.py talks to libbpf through ctypes: its mirrors of libbpf's option structs and of the
heads of the kernel's bpf_map_info and bpf_prog_info must sit where the headers put them. Each field's
offset and size is compiled against <bpf/bpf.h> (libbpf-dev, the same package version as the libbpf1 the
agents load) and <linux/bpf.h> with the host C compiler; a drifted mirror fails, naming the field. The
mirrors are prefixes (libbpf reads no option past the ``sz`` given; the kernel structs only grow at their
end), so only offsets and sizes are checked, not the whole struct's size."""
from __future__ import annotations

import ctypes as ct
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from netns_testbed import bpfmaps

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
LIBBPF_H = Path("/usr/include/bpf/bpf.h")
UAPI_H = Path("/usr/include/linux/bpf.h")

MIRRORS = {"bpf_obj_get_opts": bpfmaps.ObjGetOpts, "bpf_map_create_opts": bpfmaps.MapCreateOpts,
           "bpf_prog_load_opts": bpfmaps.ProgLoadOpts, "bpf_test_run_opts": bpfmaps.TestRunOpts,
           "bpf_link_create_opts": bpfmaps.LinkCreateOpts, "bpf_prog_query_opts": bpfmaps.ProgQueryOpts,
           "bpf_map_info": bpfmaps.MapInfo, "bpf_prog_info": bpfmaps.ProgInfo}
CONSTANTS = {"BPF_F_RDONLY": bpfmaps.BPF_F_RDONLY, "BPF_ANY": bpfmaps.BPF_ANY,
             "BPF_PROG_TYPE_SCHED_CLS": bpfmaps.BPF_PROG_TYPE_SCHED_CLS, "BPF_PSEUDO_MAP_FD": bpfmaps.BPF_PSEUDO_MAP_FD,
             "(BPF_LD | BPF_IMM | BPF_DW)": bpfmaps.BPF_LD_IMM64}
TCX_CONSTANTS = {"BPF_TCX_INGRESS": bpfmaps.BPF_TCX_INGRESS, "BPF_TCX_EGRESS": bpfmaps.BPF_TCX_EGRESS,
                 "BPF_F_BEFORE": bpfmaps.BPF_F_BEFORE}     # 6.6+ UAPI: checked where the headers have them

pytestmark = pytest.mark.skipif(CC is None or not LIBBPF_H.exists(),
                                reason="no C compiler or no libbpf headers (scripts/setup.sh installs both)")


def asserts(mirrors: dict[str, type[ct.Structure]], constants: dict[str, int]) -> str:
    out = []
    for cname, mirror in mirrors.items():
        for fname, _ in mirror._fields_:
            f = getattr(mirror, fname)
            out.append(f'_Static_assert(__builtin_offsetof(struct {cname}, {fname}) == {f.offset}, '
                       f'"struct {cname}.{fname}: offset {f.offset} in bpfmaps.py");')
            out.append(f'_Static_assert(sizeof(((struct {cname} *)0)->{fname}) == {f.size}, '
                       f'"struct {cname}.{fname}: size {f.size} in bpfmaps.py");')
    for name, value in constants.items():
        out.append(f'_Static_assert({name} == {value}, "{name}: {value} in bpfmaps.py");')
    return "\n".join(out)


def compile_asserts(text: str) -> subprocess.CompletedProcess:
    src = "#include <stddef.h>\n#include <linux/bpf.h>\n#include <bpf/bpf.h>\n" + text + "\n"
    return subprocess.run([CC, "-std=gnu11", "-fsyntax-only", "-x", "c", "-"], input=src, capture_output=True,
                          text=True, timeout=60)


def constants() -> dict[str, int]:
    have = UAPI_H.read_text()
    return {**CONSTANTS, **{k: v for k, v in TCX_CONSTANTS.items() if re.search(rf"\b{k}\b", have)}}


def test_the_mirrors_are_where_the_headers_put_them():
    out = compile_asserts(asserts(MIRRORS, constants()))
    assert out.returncode == 0, out.stderr


def test_a_drifted_mirror_fails_naming_the_field():
    class Drifted(ct.Structure):     # bpf_test_run_opts with data_size_in and data_size_out swapped for a u64
        _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                    ("data_size_in", ct.c_uint64)]

    out = compile_asserts(asserts({"bpf_test_run_opts": Drifted}, {"BPF_F_RDONLY": 4}))
    assert out.returncode != 0
    assert "struct bpf_test_run_opts.data_size_in: size 8 in bpfmaps.py" in out.stderr
    assert "BPF_F_RDONLY: 4 in bpfmaps.py" in out.stderr


def test_no_syscall_number_or_bpf_attr_in_the_tree():
    """The bpf(2) calls are libbpf's: nothing here names the syscall or lays out union bpf_attr."""
    root = Path(bpfmaps.__file__).resolve().parent.parent
    for f in list((root / "netns_testbed").glob("*.py")) + list((root / "agent").glob("*.py")):
        text = f.read_text()
        assert "libc.syscall" not in text and "SYS_BPF" not in text and "_Attr(ct.Structure)" not in text, f.name
