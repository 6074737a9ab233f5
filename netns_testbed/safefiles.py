"""Files an agent writes where other users may have been first.

An agent runs as root and writes detector state, verdict evidence, alert and incident
logs and pulse records into directories a user names (``--alerts /var/log/...``, a site
file's ``state_dir``). Another local user who can write into one of them could plant a
symlink at the name root is about to write and have root overwrite its target, or swap a
directory for one of their own. So every writer here:

- creates its directories ``0700`` and refuses one that is a symlink, is not owned by
  this user (or root), or that another user can write (:func:`secure_dir`); the existing
  directories above it must not be writable by others either, unless sticky (``/tmp``:
  nobody can rename or remove what another user made there);
- works through a descriptor of that checked directory (``openat``), so the directory
  checked is the one written into;
- writes a whole file under an unpredictable temporary name created ``O_EXCL |
  O_NOFOLLOW`` and renames it over the target (:func:`write_atomic`): ``rename(2)``
  replaces a planted symlink, it never follows it;
- appends (logs) through ``O_NOFOLLOW`` to a regular file owned by this user
  (:func:`open_append`).

Readers of files others may write (:func:`read_bounded`) refuse symlinks, anything but a
regular file, and more than ``limit`` bytes, so that a planted ``/dev/zero`` cannot fill
the agent's memory.

A refusal raises :class:`UnsafePath` (an environment problem, exit 3) naming the path and
the fix.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem
from netns_testbed.untrusted import text_of

READ_LIMIT = 16 << 20      # bytes: the largest file (state, verdicts, reports) an agent reads


class UnsafePath(EnvironmentProblem):
    """A directory or file another user could have planted or can change (exit 3)."""


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def _check_dir(path: Path, st: os.stat_result, own: bool) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory: give a directory of your own (for example under /var/lib)")
    if own and not _trusted_owner(st):
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user: give a directory of your own "
                         f"(for example under /var/lib/flowpulse)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (st.st_mode & stat.S_ISVTX):
        raise UnsafePath(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"chmod go-w {path}, or give a directory only you can write")
    if own and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePath(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"chmod 700 {path}, or give a directory only you can write")


def secure_dir(path: Path | str, mode: int = 0o700) -> Path:
    """``path`` as a directory only this user can change: made ``mode`` (with its missing parents, also
    ``mode``) if it does not exist; refused (:class:`UnsafePath`) if it, or an existing directory above it,
    is a symlink planted by another user, belongs to another user or is writable by others (a sticky
    directory such as ``/tmp`` is fine above it, never as it)."""
    path = Path(os.path.abspath(path))
    parts = path.parts
    cur = Path(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        cur = cur / part
        last = i == len(parts) - 1
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            try:
                os.mkdir(cur, mode)
            except FileExistsError:
                pass
            st = os.lstat(cur)
        if stat.S_ISLNK(st.st_mode):
            # a link above the directory is the system's (/var/run -> /run) or this user's own, or refused
            if last or not _trusted_owner(st):
                raise UnsafePath(f"{cur} is a symbolic link: give the real directory (realpath {cur})")
            st = os.stat(cur)
        _check_dir(cur, st, own=last)
    return path


def writable_dir(path: Path | str, what: str) -> Path:
    """:func:`secure_dir`, and one this process can write (a read-only file system, such as everything but
    a unit's ``ReadWritePaths`` under ``ProtectSystem=strict``, is told at start, not at the first write).
    ``what`` names it in the message (``state_dir``)."""
    try:
        path = secure_dir(path)
    except OSError as e:
        raise UnsafePath(f"{what} {path}: cannot create it ({e.strerror}): give a directory this user can write "
                         f"(under systemd, one in the unit's ReadWritePaths)") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UnsafePath(f"{what} {path}: not writable here (read-only file system or permissions): give a directory "
                         f"this user can write (under systemd, one in the unit's ReadWritePaths)")
    return path


def _dir_fd(directory: Path) -> int:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_dir(directory, os.fstat(fd), own=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path | str, data: bytes | str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` in one rename, in a directory :func:`secure_dir` accepts (made if
    missing). Readers see the old file or the new one, never a half; a symlink planted at ``path`` is
    replaced, never followed; the temporary file has an unpredictable name and is created exclusively."""
    path = Path(path)
    directory = secure_dir(path.parent)
    if isinstance(data, str):
        data = data.encode()
    dfd = _dir_fd(directory)
    try:
        tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(dfd)


def open_append(path: Path | str, mode: int = 0o600):
    """``path`` opened for appending text (a log of JSON lines), in a directory :func:`secure_dir` accepts
    (made if missing); created ``mode`` if missing; refused if it is a symlink, not a regular file or
    owned by another user."""
    path = Path(path)
    directory = secure_dir(path.parent)
    dfd = _dir_fd(directory)
    try:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=dfd)
        except OSError as e:
            if os.path.islink(path):
                raise UnsafePath(f"{path} is a symbolic link: remove it, or give another file") from e
            raise
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_owner(st):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file of this user: remove it, or give another file")
    return os.fdopen(fd, "a")


def read_bounded(path: Path | str, limit: int = READ_LIMIT) -> str:
    """The text of ``path``, a regular file that is not a symlink, at most ``limit`` bytes. Raises
    :class:`OSError` (the file is missing, a link, not regular) or :class:`BadInput` (too large, not
    UTF-8), which readers of untrusted files count as bad input."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    return text_of(data, limit)
