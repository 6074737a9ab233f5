"""Small helpers for working inside network namespaces from one process.

``in_netns`` switches only the calling thread (setns(2)), so sockets and
/proc/sys/net files opened inside the block belong to that namespace and stay
there after the block ends: tests craft traffic from host namespaces without
spawning a process per packet.
"""
from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from netns_testbed.errors import EnvironmentProblem

if TYPE_CHECKING:
    from pyroute2 import IPRoute

NETNS_RUN_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


# pyroute2 creates a namespace (and opens a netlink socket inside one) in a forked child and waits
# pyroute2.config.default_communicate_timeout (2 s) for its answer. Right after a testbed is removed
# the kernel is still dismantling its namespaces, and unshare(CLONE_NEWNET) waits for that: the first
# namespace of an 8x8x1 fabric built again in the same process took 2.7 s here, so every second build
# of a bench or a test session failed with "no response from the child" (the child was waiting, not
# hung). The wait is the kernel's; this is a hang guard, stretched by FLOWPULSE_SLOWDOWN.
NETNS_CHILD_TIMEOUT_S = 60.0


def allow_netns_children(factor: float) -> None:
    """Give pyroute2's namespace children ``NETNS_CHILD_TIMEOUT_S x factor`` to answer (never less
    than it already allows)."""
    import pyroute2.config as pyroute2_config

    pyroute2_config.default_communicate_timeout = max(pyroute2_config.default_communicate_timeout,
                                                      NETNS_CHILD_TIMEOUT_S * factor)


def require_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("this needs root (network namespaces and eBPF): rerun with sudo")


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace ``name`` for good (a forked child with one thread:
    the whole process)."""
    with open(NETNS_RUN_DIR / name) as target:
        _setns(target.fileno())


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the block with this thread in namespace ``name``, then come back."""
    with open("/proc/thread-self/ns/net") as home:
        enter_netns(name)
        try:
            yield
        finally:
            _setns(home.fileno())


@contextlib.contextmanager
def private_netns() -> Iterator[None]:
    """Run the block with this thread in a new, nameless network namespace, then come back; the
    kernel frees the namespace with its last user (nothing to clean up, even after SIGKILL)."""
    with open("/proc/thread-self/ns/net") as home:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare: {os.strerror(err)}")
        try:
            yield
        finally:
            _setns(home.fileno())


@contextlib.contextmanager
def iproute(name: str) -> Iterator["IPRoute"]:
    """A pyroute2 IPRoute whose netlink socket lives in namespace ``name``.

    The socket is opened by this thread inside the namespace (``in_netns``) and keeps to it after the
    thread comes back. ``IPRoute(netns=name)`` forks a helper process for every socket instead (about
    20 ms each; a 4x4x2 ``fabric up`` opened 60 of them, 1.3 s of its 3 s)."""
    from pyroute2 import IPRoute

    with in_netns(name):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


# ethtool's -K names and the kernel features each one covers (ethtool's own table, common.c): "tso" is
# every tx-tcp*-segmentation, tx-tcp-accecn-segmentation (6.18) included, which the legacy ETHTOOL_STSO
# ioctl leaves on
OFFLOAD_FEATURES = {"tso": "tx-tcp*-segmentation", "gso": "tx-generic-segmentation", "gro": "rx-gro"}


def set_offloads(name: str, ifnames: Sequence[str], offloads: Sequence[str], on: bool) -> None:
    """Turn segmentation offloads (keys of ``OFFLOAD_FEATURES``) on or off on interfaces of namespace
    ``name``, as ``ethtool -K <if> tso off ...`` does, but in this process: ETHTOOL_SFEATURES on a socket
    opened inside the namespace (pyroute2's ioctl layer), no ``ip netns exec ethtool`` per port. Each
    changeable feature is read back; one that did not take raises."""
    from pyroute2.ethtool.ioctl import ETH_SS_FEATURES, IoctlEthtool

    class Ethtool(IoctlEthtool):
        # The feature names (ETH_SS_FEATURES) are the kernel's one table for every device: read them
        # once per socket, not twice per port (pyroute2 decodes them char by char: ~1 ms a read, 1,152
        # reads in a 16x16x2 `fabric up`).
        names: dict = {}

        def get_stringset(self, set_id=ETH_SS_FEATURES, *a, **kw):
            if set_id != ETH_SS_FEATURES or a or kw:
                return super().get_stringset(set_id, *a, **kw)
            if set_id not in self.names:
                self.names[set_id] = super().get_stringset(set_id)
            return self.names[set_id]

    patterns = [OFFLOAD_FEATURES[o] for o in offloads]
    with in_netns(name):
        eth = Ethtool()
    try:
        for ifname in ifnames:
            eth.change_ifname(ifname)
            try:
                feats = eth.get_features()
                wanted = [f for f in feats.keys()
                          if any(fnmatch.fnmatchcase(f, p) for p in patterns) and feats.is_available(f)]
                for f in wanted:
                    feats.set_value(f, on)
                eth.set_features(feats)
                now = eth.get_features()
            except OSError as e:
                raise EnvironmentProblem(f"cannot set offloads on {ifname} in {name}: "
                                         f"{os.strerror(e.errno) if e.errno else e}") from None
            kept = [f for f in wanted if now.is_active(f) != on]
            if kept:
                raise EnvironmentProblem(f"{ifname} in {name} kept {', '.join(kept)} {'off' if on else 'on'}: "
                                         "its driver does not let them change (rerun with --offloads to leave them)")
    finally:
        eth.close()


def sysctl(name: str, key: str, value: str | int) -> None:
    """Set ``net.*`` sysctl ``key`` (dotted) inside namespace ``name``."""
    with in_netns(name):
        Path("/proc/sys", *key.split(".")).write_text(f"{value}\n")


def netns_argv(name: str, argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` inside namespace ``name`` (no shell involved)."""
    return ["ip", "netns", "exec", name, *argv]


def snmp(name: str) -> dict[str, dict[str, int]]:
    """The namespace's /proc/net/snmp (IP/ICMP/TCP/UDP MIB counters)."""
    with in_netns(name):
        text = Path("/proc/net/snmp").read_text() + Path("/proc/net/netstat").read_text()
    return parse_mib(text)


def parse_mib(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp-style text (a header line, then a values line, per protocol) as nested dicts."""
    lines = text.splitlines()
    out: dict[str, dict[str, int]] = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        proto, *keys = head.split()
        _, *nums = vals.split()
        out.setdefault(proto.rstrip(":"), {}).update({k: int(v) for k, v in zip(keys, nums)})
    return out


def pids_in_netns(name: str) -> list[int]:
    """PIDs of processes whose network namespace is ``name`` (read from /proc)."""
    try:
        st = os.stat(NETNS_RUN_DIR / name)
    except FileNotFoundError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            s = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (s.st_ino, s.st_dev) == (st.st_ino, st.st_dev) and int(entry) != os.getpid():
            out.append(int(entry))
    return out


def kill_pids(pids: list[int], grace: float = 0.0) -> None:
    """SIGTERM (if ``grace``) then SIGKILL; waits a bounded time for them to go."""
    if grace > 0:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False
