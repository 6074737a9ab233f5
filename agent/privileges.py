"""Drop every capability an agent does not need once its counters are open.

An agent started with ``sudo`` holds all of root's capabilities; after it has opened its maps (and,
on a site, attached its counting program) it needs only:

* ``CAP_BPF``: every bpf(2) call, map reads included, when unprivileged BPF is disabled (the
  Debian/Ubuntu default); re-opening the pins after a testbed reload;
* ``CAP_NET_ADMIN``: a site agent detaching its tc filters at exit;
* ``CAP_SYS_NICE``: the poller's raised priority (see :func:`agent.daemon.run_agents`).

:func:`keep_only` narrows the bounding, permitted, effective and inheritable sets to those, so a
bug in the agent cannot load programs' worth of damage elsewhere (no CAP_SYS_ADMIN, no
CAP_DAC_OVERRIDE, no CAP_SYS_MODULE...). Capabilities are per thread: call it before the agent
starts threads (the metrics server, poll threads), which then inherit the narrowed sets.
"""
from __future__ import annotations

import ctypes as ct
import errno
import logging
import os
import threading

log = logging.getLogger("flowpulse.agent")

CAPS = {"CAP_DAC_OVERRIDE": 1, "CAP_SETPCAP": 8, "CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21, "CAP_SYS_NICE": 23,
        "CAP_PERFMON": 38, "CAP_BPF": 39}
TESTBED_AGENT = ("CAP_BPF", "CAP_SYS_NICE")
SITE_AGENT_EBPF = ("CAP_BPF", "CAP_NET_ADMIN", "CAP_SYS_NICE")
SITE_AGENT_NETLINK = ("CAP_SYS_NICE",)

_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_libc = ct.CDLL(None, use_errno=True)


class _Header(ct.Structure):
    _fields_ = [("version", ct.c_uint32), ("pid", ct.c_int)]


class _Data(ct.Structure):
    _fields_ = [("effective", ct.c_uint32), ("permitted", ct.c_uint32), ("inheritable", ct.c_uint32)]


def effective() -> int:
    """This process's effective capability mask (/proc/self/status)."""
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def mask_of(names: tuple[str, ...]) -> int:
    return sum(1 << CAPS[n] for n in names)


def keep_only(names: tuple[str, ...]) -> bool:
    """Keep just ``names`` (of those this process holds). Returns False, changing nothing, when the
    process lacks CAP_SETPCAP (not root, or already narrowed by systemd/setpriv): nothing to drop
    then, or not ours to drop."""
    held = effective()
    if not held & (1 << CAPS["CAP_SETPCAP"]):
        return False
    if threading.active_count() > 1:
        log.warning("dropping capabilities with %d threads running: only this thread's are dropped",
                    threading.active_count())
    keep = mask_of(names) & held
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if not keep & (1 << cap):
            if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ct.get_errno() != errno.EINVAL:
                raise OSError(ct.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ct.get_errno())}")
    hdr = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for i in range(2):
        part = (keep >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = part
        data[i].inheritable = 0
    if _libc.capset(ct.byref(hdr), data) != 0:
        raise OSError(ct.get_errno(), f"capset: {os.strerror(ct.get_errno())}")
    log.info("capabilities narrowed to %s", " ".join(n for n in names if keep & (1 << CAPS[n])) or "none")
    return True
