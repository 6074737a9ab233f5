"""The C/Python contract: the assertions generated from datapath.py's mirrors hold for bpf/switch.h, and a
mirror that drifts fails them, naming the fact (host C compiler, no root; the datapath's own load
compiles the same assertions with BCC)."""
from __future__ import annotations

import ctypes as ct
import shutil
import subprocess

import pytest

from netns_testbed import datapath as dp
from netns_testbed.contract import drift_from, static_asserts
from netns_testbed.topo import Fabric, FabricSpec

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
PRELUDE = "typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef unsigned long long u64;\n" \
          '#include "switch.h"\n'


def compile_with(asserts: str, extra: str = "") -> subprocess.CompletedProcess:
    src = PRELUDE + extra + asserts
    return subprocess.run([CC, "-std=c11", "-fsyntax-only", f"-I{dp.BPF_DIR}", "-x", "c", "-"], input=src,
                          capture_output=True, text=True, timeout=60)


pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (scripts/setup.sh installs one)")


def test_mirrors_agree_with_the_header():
    out = compile_with(static_asserts(dp.C_STRUCTS, dp.C_CONSTANTS))
    assert out.returncode == 0, out.stderr


def test_every_struct_and_define_of_the_header_is_mirrored():
    text = (dp.BPF_DIR / "switch.h").read_text()
    import re
    defines = set(re.findall(r"^#define (FP_[A-Z0-9_]+) ", text, re.M)) - {"FP_PULSE_TIME_MASK"}
    structs = set(re.findall(r"^struct (fp_[a-z_]+) \{", text, re.M))
    assert defines <= set(dp.C_CONSTANTS), defines - set(dp.C_CONSTANTS)
    assert structs == set(dp.C_STRUCTS)


def test_each_shape_checks_its_map_sizes():
    shape = dp.SwitchShape.of(Fabric(FabricSpec(leaves=3, spines=5, hosts_per_leaf=2)), "leaf1")
    defs = "".join(f"#define {f[2:].replace('=', ' ')}\n" for f in shape.cflags() if f.startswith("-D"))
    out = compile_with(dp.contract_asserts(shape), defs)
    assert out.returncode == 0, out.stderr
    wrong = dp.SwitchShape(shape.nports + 1, shape.nleaves, shape.is_leaf, shape.leaf_id, shape.nuplinks)
    out = compile_with(dp.contract_asserts(wrong), defs)
    assert out.returncode != 0 and "NPORTS * 2 * NSRC" in drift_from(out.stderr)


class FaultSwapped(ct.Structure):           # match_ip after prob: its offset moves from 4 to 16
    _fields_ = [("kind", ct.c_uint32), ("prob", ct.c_uint64), ("match_ip", ct.c_uint32)] + \
        [(n, t) for n, t in dp.Fault._fields_ if n not in ("kind", "match_ip", "prob")]


@pytest.mark.parametrize("structs,constants,named", [
    ({**dp.C_STRUCTS, "fp_fault": FaultSwapped}, dp.C_CONSTANTS, "fp_fault.match_ip: offset 16 in Python"),
    (dp.C_STRUCTS, {**dp.C_CONSTANTS, "FP_KIND_BADHDR": 3}, "FP_KIND_BADHDR: 3 in Python"),
    (dp.C_STRUCTS, {**dp.C_CONSTANTS, "FP_SPRAY_SLOTS": 128}, "FP_SPRAY_SLOTS: 128 in Python"),
])
def test_a_drifted_mirror_fails_and_is_named(structs, constants, named):
    out = compile_with(static_asserts(structs, constants))
    assert out.returncode != 0
    assert drift_from(out.stderr), out.stderr          # the load's message names the first fact
    assert named in out.stderr, out.stderr


@pytest.mark.root
def test_loading_a_drifted_datapath_fails_with_the_fact_named(monkeypatch):
    """The real compile (BCC) with a mirror out of step: EnvironmentProblem naming it, nothing attached."""
    from netns_testbed.errors import EnvironmentProblem

    shape = dp.SwitchShape.of(Fabric(FabricSpec(leaves=2, spines=2, hosts_per_leaf=1)), "leaf0")
    dp.Loader().load(shape).close()      # the program as it should be, compiled and cached
    monkeypatch.setitem(dp.C_CONSTANTS, "FP_KIND_BADHDR", 3)
    with pytest.raises(EnvironmentProblem, match="disagree: FP_KIND_BADHDR: 3 in Python"):
        dp.compile_template(shape)
    # the loader's cache never hides a drift: the assertions are part of the text its entries are named by
    with pytest.raises(EnvironmentProblem, match="disagree: FP_KIND_BADHDR: 3 in Python"):
        dp.Loader().load(shape)


@pytest.mark.parametrize("program", ["switch.c", "count.c"])
def test_both_programs_count_with_one_spliced_text(program):
    """count.c (the site agent) and switch.c (the testbed) get bpf/counting.inc spliced in once each,
    where they mark it: the maps and code that count are one text, not two copies."""
    inc = (dp.BPF_DIR / "counting.inc").read_text()
    text = dp.source_text(dp.BPF_DIR / program)
    assert text.count(inc) == 1
    assert not dp.SPLICE.search(text)                                  # every marker replaced
    assert "u64 pulse_tick(" not in (dp.BPF_DIR / program).read_text()   # defined in counting.inc only


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return bytes([code, src << 4 | dst]) + off.to_bytes(2, "little", signed=True) + imm.to_bytes(4, "little", signed=True)


def test_a_copy_of_a_program_names_its_own_maps():
    """Each switch's copy of the compiled program gets its own maps: the 64-bit immediate loads that
    name a map descriptor (BPF_PSEUDO_MAP_FD) are rewritten, and nothing else that holds the same number."""
    from netns_testbed.bpfmaps import map_fds_in, patch_map_fds

    code = b"".join([
        insn(0x18, dst=1, src=1, imm=5), insn(0, imm=0),       # r1 = map fd 5
        insn(0xb7, dst=0, imm=5),                              # r0 = 5: a plain constant
        insn(0x18, dst=2, src=0, imm=5), insn(0, imm=0),       # r2 = 5 (64-bit constant, not a map)
        insn(0x18, dst=3, src=1, imm=7), insn(0, imm=5),       # r3 = map fd 7 (second half holds a 5)
        insn(0x18, dst=1, src=1, imm=5), insn(0, imm=0),       # map fd 5 again
        insn(0x95)])                                           # exit
    assert map_fds_in(code) == [5, 7]
    out = patch_map_fds(code, {5: 40, 7: 41})
    assert len(out) == len(code)
    assert map_fds_in(out) == [40, 41]
    changed = [i // 8 for i in range(0, len(code), 8) if code[i:i + 8] != out[i:i + 8]]
    assert changed == [0, 5, 7]
    with pytest.raises(KeyError):
        patch_map_fds(code, {5: 40})


def test_compiler_warnings_become_one_log_record_not_raw_lines(caplog, capfd):
    """clang on 6.12's headers prints warnings (and their include chains) on fd 2; an agent run with --log-json
    must keep its stderr JSON: the diagnostics go through logging, one line at info, in full at debug."""
    import logging
    import os

    text = ("In file included from <built-in>:4:\narch/x86/include/asm/ibt.h:77:8: warning: 'nocf_check' attribute "
            "ignored [-Wignored-attributes]\nextern __noendbr u64 ibt_save(bool disable);\n       ^\n"
            "arch/x86/include/asm/current.h:47:10: warning: multiple identical address spaces [-Wduplicate-decl-specifier]\n")
    with caplog.at_level(logging.DEBUG, logger="flowpulse.datapath"):
        with dp.compiler_output():
            os.write(2, text.encode())
    assert capfd.readouterr().err == ""                  # nothing raw on stderr
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "2 warning(s)" in infos[0].getMessage() and "nocf_check" in infos[0].getMessage()
    assert any(r.levelno == logging.DEBUG and "In file included" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="flowpulse.datapath"):
        with dp.compiler_output():
            os.write(2, b"/virtual/main.c:3:1: error: unknown type name 'u33'\n")
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
