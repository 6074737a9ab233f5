"""Shared fixtures. Root tests build real testbeds with the prefix ``tf<pid%1000><n>``
(8 characters, unique within a run). Each prefix is registered with the pytest process
that made it (``/run/flowpulse-tests/<prefix>``); at session start and end the ``tf*``
testbeds whose process is gone (a killed run) are removed, and nothing of another live run."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest

from netns_testbed.slowdown import slowdown

IS_ROOT = os.geteuid() == 0
TRACES = Path(__file__).parent / "data" / "pulse-traces"   # recorded runs shipped with the repository
_counter = itertools.count()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Per-test time limits (pytest-timeout's --timeout) stretch by the machine's slowdown, as job
    deadlines and waits do: an emulated guest (netns_testbed/slowdown.py) is slow, not hung."""
    if getattr(config, "_env_timeout", None) and slowdown() > 1:
        config._env_timeout *= slowdown()


def pytest_collection_modifyitems(config, items):
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (builds network namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


OWNERS = Path("/run/flowpulse-tests")


def _alive(pid: int) -> bool:
    try:
        return b"pytest" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _owner(prefix: str) -> int | None:
    try:
        return int((OWNERS / prefix).read_text())
    except (OSError, ValueError):
        return None


def _test_prefixes() -> list[str]:
    """Test testbeds that belong to this run or to no live run."""
    from netns_testbed.builder import list_testbeds

    out = []
    for p in list_testbeds():
        if not p.startswith("tf"):
            continue
        owner = _owner(p)
        if owner is None or owner == os.getpid() or not _alive(owner):
            out.append(p)
    return out


def _forget_stale_owners() -> None:
    if OWNERS.is_dir():
        for f in OWNERS.iterdir():
            owner = _owner(f.name)
            if owner is None or owner == os.getpid() or not _alive(owner):
                f.unlink(missing_ok=True)


_SESSION_PID = os.getpid()


def _interrupt(signum, frame):
    if os.getpid() != _SESSION_PID:
        # a forked helper (pyroute2 forks one per namespace it creates and stops it with SIGTERM):
        # die as the signal says; unwinding the copied stack would run the test's cleanup in the
        # child and take the half-built testbed down under the parent
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def _own_program_cache(tmp_path_factory):
    """Compiled programs cached in this session's temporary directory, not /var/cache: a test run
    leaves nothing outside pytest's own temporary directories (and starts from no cache, as CI does)."""
    if "FLOWPULSE_BPF_CACHE" in os.environ:
        yield
        return
    os.environ["FLOWPULSE_BPF_CACHE"] = str(tmp_path_factory.mktemp("bpfcache"))
    yield
    os.environ.pop("FLOWPULSE_BPF_CACHE", None)


@pytest.fixture(scope="session", autouse=True)
def _clean_leftovers():
    # SIGTERM (a CI timeout, kill) and SIGHUP unwind like Ctrl-C: every fixture's teardown and every
    # experiment's finally block take their testbeds down. SIGKILL cannot be caught: the next run
    # removes testbeds whose owning pytest is gone (see _test_prefixes).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    if IS_ROOT:
        from netns_testbed.builder import down

        for p in _test_prefixes():
            down(p)
        _forget_stale_owners()
    yield
    if IS_ROOT:
        from netns_testbed.builder import down

        for p in _test_prefixes():
            down(p)
        _forget_stale_owners()


def new_prefix() -> str:
    n = next(_counter)
    assert n < 1000, "test prefix space exhausted"
    prefix = f"tf{os.getpid() % 1000:03d}{n:03d}"
    if IS_ROOT:
        OWNERS.mkdir(mode=0o700, exist_ok=True)
        (OWNERS / prefix).write_text(str(os.getpid()))
    return prefix


@pytest.fixture
def make_testbed():
    """Factory: build a testbed (kwargs: spec fields and UpOptions fields); always torn down."""
    from netns_testbed import builder
    from netns_testbed.builder import UpOptions
    from netns_testbed.topo import FabricSpec

    built: list[str] = []

    def make(leaves=4, spines=4, hosts_per_leaf=2, mtu=1500, **opts):
        prefix = new_prefix()
        built.append(prefix)
        return builder.up(prefix, FabricSpec(leaves, spines, hosts_per_leaf, mtu), UpOptions(**opts))

    yield make
    for p in built:
        builder.down(p)


@pytest.fixture(scope="module")
def default_testbed():
    """One default 4x4x2 testbed (rrdst) shared by a module's read-only tests."""
    from netns_testbed import builder

    prefix = new_prefix()
    tb = builder.up(prefix, __import__("netns_testbed.topo", fromlist=["FabricSpec"]).FabricSpec())
    yield tb
    builder.down(prefix)


def idle_ms(ms: int) -> int:
    """A job's idle between iterations, its stand-in for compute, stretched by the machine's slowdown as
    compute would be: an emulated guest runs a rank's Python and gloo many times slower, not its sleep.
    Pulses are cut at the gap between iterations; in the Debian 6.1 guest (14.9x) the ranks' skew outlasted
    a 150 ms idle in 26 of 29 iterations (the next began on one rank up to 0.25 s before the last ended
    on another), the leaves' pulses held parts of two, and a 2% leaf-to-host loss was missed
    (tests/data/recorded-runs/guest-6.1-host-loss-merged-pulses). 1x on real hardware."""
    return round(ms * slowdown())


def wait_iteration(progress: Path, i: int, timeout: float = 120) -> None:
    """Until rank 0 reports the end of iteration ``i`` (the idle gap before i + 1 begins)."""
    deadline = time.time() + timeout * slowdown()
    while time.time() < deadline:
        if progress.exists():
            for line in progress.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    rec = json.loads(line)
                    if rec.get("phase") == "end" and rec.get("i") == i:
                        return
        time.sleep(0.01)
    raise TimeoutError(f"iteration {i} did not end within {timeout} s")
