"""Compiled programs kept on disk, so that a `fabric up` after the first compiles nothing.

An entry is what a copy of a compiled program needs (its functions' instructions, the specs of the
maps they name, the license: :class:`netns_testbed.datapath.Template`), as JSON. Its name is a
SHA-256 over everything the compile depends on: the program text as compiled (the contract's
assertions included), the flags, the running kernel (release and build), the kernel headers BCC
compiled against (path and modification time) and BCC's version. Anything else changes nothing the
compiler sees.

Root loads these instructions into the kernel, so an entry is trusted only in a directory owned by
root that nobody else can write, and only from a regular file owned by root that nobody else can
write (opened without following links). Anything else, and anything that does not parse, is ignored
and compiled again. ``FLOWPULSE_BPF_CACHE`` names another directory; ``off`` turns the cache off.
Removing the directory is always safe.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

DEFAULT_DIR = Path("/var/cache/flowpulse/bpf")
FORMAT = 1


def directory() -> Path | None:
    """Where entries live, or None if the cache is off."""
    env = os.environ.get("FLOWPULSE_BPF_CACHE")
    if env is not None and env.strip().lower() in ("", "off", "0", "no"):
        return None
    return Path(env) if env else DEFAULT_DIR


def key(text: str, cflags: list[str] | tuple[str, ...], headers: Path, bcc_version: str) -> str:
    """The entry name for a compile of ``text`` with ``cflags`` against ``headers`` on this kernel."""
    try:
        hstamp = str(os.stat(headers / "Makefile").st_mtime_ns)
    except OSError:
        hstamp = "-"
    u = os.uname()
    h = hashlib.sha256()
    for part in (str(FORMAT), text, "\0".join(cflags), u.release, u.version, u.machine,
                 str(headers.resolve()), hstamp, bcc_version):
        h.update(part.encode())
        h.update(b"\0\1\0")
    return h.hexdigest()


def _trusted(st: os.stat_result, kind) -> bool:
    return kind(st.st_mode) and st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted_dir(d: Path) -> bool:
    """``d`` is root's and only root writes in it; its parent is root's and either only root writes
    in it or it is sticky (/tmp: nobody else may rename or remove what root made there)."""
    try:
        parent = os.lstat(d.parent)
        return _trusted(os.lstat(d), stat.S_ISDIR) and stat.S_ISDIR(parent.st_mode) and parent.st_uid == 0 and \
            (not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or bool(parent.st_mode & stat.S_ISVTX))
    except OSError:
        return False


def load(name: str) -> dict | None:
    """The entry ``name`` if it exists and can be trusted, else None."""
    d = directory()
    if d is None or not _trusted_dir(d):
        return None
    try:
        fd = os.open(d / f"{name}.json", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(fd), stat.S_ISREG):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            entry = json.loads(f.read(16 << 20))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != name:
        return None
    return entry


def store(name: str, entry: dict) -> None:
    """Write entry ``name`` (as root; silently nothing where the directory cannot be made safe)."""
    d = directory()
    if d is None or os.geteuid() != 0:
        return
    try:
        d.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return
    if not _trusted_dir(d):
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    except OSError:          # a read-only file system (a unit's ProtectSystem=strict): no cache, no error
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({**entry, "format": FORMAT, "key": name}, f)
        os.replace(tmp, d / f"{name}.json")
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def drop(name: str) -> None:
    """Remove entry ``name`` (one that no longer loads)."""
    d = directory()
    if d is not None and _trusted_dir(d):
        with contextlib.suppress(OSError):
            os.unlink(d / f"{name}.json")

