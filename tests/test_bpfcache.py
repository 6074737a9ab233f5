"""The on-disk cache of compiled switch programs (netns_testbed.bpfcache): a second load compiles
nothing and runs the same program; an entry that is not root's alone, does not parse, or belongs to
another shape is never loaded; anything the compiler sees changes the entry's name."""
from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from netns_testbed import bpfcache
from netns_testbed import datapath as dp
from netns_testbed.topo import Fabric, FabricSpec

FABRIC = Fabric(FabricSpec(leaves=3, spines=4, hosts_per_leaf=2))


def test_the_name_changes_with_anything_the_compiler_sees(tmp_path):
    headers = tmp_path / "build"
    headers.mkdir()
    (headers / "Makefile").write_text("x")
    base = bpfcache.key("int x;", ["-DA=1"], headers, "0.26.0")
    assert base == bpfcache.key("int x;", ["-DA=1"], headers, "0.26.0")
    others = {bpfcache.key("int y;", ["-DA=1"], headers, "0.26.0"),
              bpfcache.key("int x;", ["-DA=2"], headers, "0.26.0"),
              bpfcache.key("int x;", ["-DA=1"], headers, "0.29.1")}
    os.utime(headers / "Makefile", ns=(1, 1))
    others.add(bpfcache.key("int x;", ["-DA=1"], headers, "0.26.0"))
    assert base not in others and len(others) == 4


@pytest.mark.parametrize("value", ["off", "", "0"])
def test_the_cache_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv("FLOWPULSE_BPF_CACHE", value)
    assert bpfcache.directory() is None


# -- loading through the cache (root: compiles and loads programs) ---------------------------------
def loads(cache: Path, monkeypatch) -> tuple[int, dp.SwitchProgram]:
    """Load leaf0's program with a fresh loader using ``cache``; (compiles it ran, the program)."""
    monkeypatch.setenv("FLOWPULSE_BPF_CACHE", str(cache))
    loader = dp.Loader()
    prog = loader.load(dp.SwitchShape.of(FABRIC, "leaf0"))
    return loader.compiled, prog


@pytest.fixture
def cache(tmp_path) -> Path:
    d = tmp_path / "cache"      # tmp_path: root's, 0700
    return d


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json"))


@pytest.mark.root
def test_a_second_load_compiles_nothing_and_runs_the_same_program(cache, monkeypatch):
    from tests.test_datapath_unit import H0, H0_PORT, H2, TC_ACT_REDIRECT, Program, tcp

    n, prog = loads(cache, monkeypatch)
    prog.close()
    assert n == 1 and len(entries(cache)) == 1
    assert oct(cache.stat().st_mode & 0o777) == "0o700" and oct(entries(cache)[0].stat().st_mode & 0o777) == "0o600"
    n, prog = loads(cache, monkeypatch)
    prog.close()
    assert n == 0
    # a program from the cache does what a compiled one does: leaf0 sprays h0 -> h2, counts it once
    loader = dp.Loader()
    p = Program("leaf0", loader)
    try:
        assert loader.compiled == 0
        p.reset()
        assert p.run("ingress", H0_PORT, tcp(src=H0, dst=H2))[0] == TC_ACT_REDIRECT
        assert p.counts().sum() == 1
    finally:
        p.close()


@pytest.mark.root
@pytest.mark.parametrize("spoil", ["group-writable file", "file not root's", "directory writable by others",
                                   "not JSON", "another shape's entry", "instructions cut short", "a link"])
def test_an_entry_that_cannot_be_trusted_is_compiled_again(cache, monkeypatch, spoil):
    n, prog = loads(cache, monkeypatch)
    prog.close()
    (entry,) = entries(cache)
    if spoil == "group-writable file":
        entry.chmod(0o620)
    elif spoil == "file not root's":
        os.chown(entry, 65534, 65534)
    elif spoil == "directory writable by others":
        cache.chmod(0o777)
    elif spoil == "not JSON":
        entry.write_text("{")
    elif spoil == "another shape's entry":
        d = json.loads(entry.read_text())
        d["cflags"] = [c.replace("-DNPORTS=6", "-DNPORTS=7") for c in d["cflags"]]
        entry.write_text(json.dumps(d))
    elif spoil == "instructions cut short":
        d = json.loads(entry.read_text())
        code = base64.b64decode(d["insns"]["fp_ingress"])   # 3 bytes off the end: no whole instruction
        d["insns"]["fp_ingress"] = base64.b64encode(code[:-3]).decode()
        entry.write_text(json.dumps(d))
    elif spoil == "a link":
        target = cache.parent / "elsewhere.json"
        entry.rename(target)
        entry.symlink_to(target)
    n, prog = loads(cache, monkeypatch)
    prog.close()
    assert n == 1, spoil


@pytest.mark.root
def test_nothing_is_written_when_the_cache_is_off(tmp_path, monkeypatch):
    monkeypatch.setattr(bpfcache, "DEFAULT_DIR", tmp_path / "default")
    monkeypatch.setenv("FLOWPULSE_BPF_CACHE", "off")
    for _ in range(2):
        loader = dp.Loader()
        loader.load(dp.SwitchShape.of(FABRIC, "spine0")).close()
        assert loader.compiled == 1
    assert not (tmp_path / "default").exists()


@pytest.mark.root
@pytest.mark.parametrize("parent_mode,trusted", [(0o755, True), (0o1777, True), (0o777, False), (0o775, False)])
def test_the_directory_is_trusted_only_where_nobody_else_can_swap_it(tmp_path, parent_mode, trusted):
    """A parent others can write could have the cache renamed away and replaced; a sticky one (/tmp)
    cannot: only the owner may rename or remove what is in it."""
    parent = tmp_path / "p"
    parent.mkdir()
    (parent / "c").mkdir(mode=0o700)
    parent.chmod(parent_mode)
    assert bpfcache._trusted_dir(parent / "c") is trusted
