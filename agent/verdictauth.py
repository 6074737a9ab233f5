"""Verdict files that cannot be forged without the fabric's verdict key.

Agents in separate processes read each other's verdicts from files (agent/incidents.py). Anyone who could
write into the verdict directory could otherwise write a well-formed file with a fresh time and make an
ambiguous incident name the wrong link. With a key, each owner adds an HMAC-SHA256 of the file's
canonical JSON (every other field, sorted keys, no spaces: the owner, its time, its ledger) and a reader
that holds the key takes no file whose MAC does not match (counted as bad input, like a malformed file).

The key is one per fabric, a file of KEY_BYTES random bytes readable by root alone: a testbed keeps it in
its run directory (made by the first agent that needs it), a site file names it (``verdict_key:``).
Whoever holds it can write any owner's verdicts: it authenticates the fabric's agents as a group, not one
agent against another.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from netns_testbed.safefiles import UnsafePath, secure_dir
from netns_testbed.untrusted import BadInput

KEY_BYTES = 32


def canonical(d: dict) -> bytes:
    """The bytes a MAC covers: every field but ``mac``, sorted, compact. Python writes a float as the
    shortest text that reads back to it, so a reader recomputes the same bytes from what it parsed."""
    return json.dumps({k: v for k, v in d.items() if k != "mac"}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def sign(key: bytes, d: dict) -> dict:
    return {**d, "mac": hmac.new(key, canonical(d), hashlib.sha256).hexdigest()}


def check(key: bytes, d: dict) -> None:
    """BadInput unless ``d`` carries the MAC ``key`` gives its content."""
    mac = d.get("mac")
    if not isinstance(mac, str):
        raise BadInput("mac: missing (this agent needs verdicts signed with the fabric's verdict key)")
    if not hmac.compare_digest(mac, hmac.new(key, canonical(d), hashlib.sha256).hexdigest()):
        raise BadInput("mac: does not match the content (not written with this fabric's verdict key)")


def load_key(path: Path | str) -> bytes:
    """The key in ``path``: a regular file (no symlink) of this user or root, that nobody else can read or
    write, of at least KEY_BYTES bytes. UnsafePath (exit 3) otherwise, naming the fix."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafePath(f"verdict key {path} does not exist: make one with `head -c 32 /dev/urandom > {path}; "
                         f"chmod 600 {path}` and give the same file to every agent of the fabric") from None
    except OSError as e:
        raise UnsafePath(f"verdict key {path}: cannot open it ({e.strerror}): give a regular file, not a link") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            raise UnsafePath(f"verdict key {path}: not a regular file of this user or root")
        if st.st_mode & 0o077:
            raise UnsafePath(f"verdict key {path} can be read or written by others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}): chmod 600 {path}")
        key = f.read(4096)
    if len(key) < KEY_BYTES:
        raise UnsafePath(f"verdict key {path} holds {len(key)} bytes, fewer than {KEY_BYTES}: make it with "
                         f"`head -c 32 /dev/urandom > {path}`")
    return key


def ensure_key(path: Path | str) -> bytes:
    """The key in ``path``, made (KEY_BYTES random bytes, 0600) if there is none yet. Made under a
    temporary name and linked in place, so that agents starting together all read the one that won."""
    path = Path(path)
    directory = secure_dir(path.parent)
    if not path.exists():
        tmp = directory / f".{path.name}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
            try:
                os.link(tmp, path)      # fails if another agent made it first: then that one is the key
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    return load_key(path)
