"""What the tests build goes away even when a run is stopped: SIGTERM unwinds it at once, SIGKILL leaves
it to the next run's sweep (root; a pytest inside pytest, one short live test)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from netns_testbed.builder import list_testbeds
from tests.conftest import OWNERS

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parent.parent
LIVE = "tests/test_localize_live.py::test_flapping_fault_localized_right"   # builds one 4x4x2 testbed


def start_inner(tmp_path: Path, test: str = LIVE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test,
                             f"--basetemp={tmp_path / 'inner'}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def built_by(pid: int, timeout: float = 120.0) -> str:
    """The prefix of the testbed the inner run registered, once all its namespaces exist."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in OWNERS.glob("tf*") if OWNERS.is_dir() else []:
            if f.read_text().strip() == str(pid) and len(list_testbeds().get(f.name, [])) >= 16:
                return f.name
        time.sleep(0.2)
    raise AssertionError("the inner run built nothing in time")


def test_sigterm_takes_the_testbed_down(tmp_path):
    inner = start_inner(tmp_path)
    try:
        prefix = built_by(inner.pid)
        inner.send_signal(signal.SIGTERM)
        inner.wait(timeout=60)
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
    assert prefix not in list_testbeds()
    assert not (OWNERS / prefix).exists()


@contextmanager
def group_killed_on_exit(proc: subprocess.Popen):
    """Whatever happens in the block, ``proc``'s process group (``start_new_session``) is gone after it."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def sigterm_and_wait(proc: subprocess.Popen, timeout: float = 90.0) -> str:
    """SIGTERM to ``proc`` alone (not its group, as `kill` or a CI timeout may); its stderr once it exits."""
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=timeout)[1]


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def test_sigterm_to_the_test_command_reaches_its_pass(tmp_path):
    """A CI timeout or a `kill` that signals scripts/test.sh alone (not its process group): the pass that
    runs gets the SIGTERM and unwinds its testbed, no further pass starts, and the script exits 143."""
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/test.sh"), "-k", LIVE.split("::")[1],
                             f"--basetemp={tmp_path / 'inner'}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    prefix, inner = None, None
    with group_killed_on_exit(proc):
        deadline = time.monotonic() + 180
        while prefix is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            for f in OWNERS.glob("tf*") if OWNERS.is_dir() else []:
                owner = f.read_text().strip()
                if owner.isdigit() and parent_of(int(owner)) == proc.pid \
                        and len(list_testbeds().get(f.name, [])) >= 16:
                    prefix, inner = f.name, int(owner)
            time.sleep(0.2)
        assert prefix is not None, "the test command's root pass built nothing in time"
        err = sigterm_and_wait(proc)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by a signal" in err
    assert parent_of(inner) is None                 # the pass itself is gone ...
    assert prefix not in list_testbeds()            # ... and took its testbed down
    assert not (OWNERS / prefix).exists()


def test_sigkill_leftovers_go_with_the_next_run(tmp_path):
    inner = start_inner(tmp_path)
    try:
        prefix = built_by(inner.pid)
        os.killpg(inner.pid, signal.SIGKILL)   # the run and everything it started, no chance to clean
        inner.wait(timeout=30)
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
    assert prefix in list_testbeds()            # SIGKILL cannot be caught ...
    nxt = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_topo.py::test_link_parsing", f"--basetemp={tmp_path / 'next'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert nxt.returncode == 0, nxt.stdout[-2000:]
    assert prefix not in list_testbeds()        # ... the next run removes what a dead run left
    assert not (OWNERS / prefix).exists()


def leftovers(prefix: str) -> dict:
    from netns_testbed.state import RUN_DIR

    return {"namespaces": list_testbeds().get(prefix, []),
            "mounts": [l for l in open("/proc/mounts") if f"/{prefix}/" in l],
            "state": (RUN_DIR / prefix).exists(), "lock": (RUN_DIR / f".{prefix}.lock").exists()}


def processes_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_sigterm_to_experiment_mid_run_leaves_nothing(tmp_path):
    """`systemctl stop`, a CI timeout: the experiment's ranks, testbed and mount go, exit 143."""
    from tests.conftest import new_prefix

    prefix, out = new_prefix(), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "flowpulse", "experiment", "--prefix", prefix, "--leaves", "2",
                             "--spines", "2", "--hosts-per-leaf", "1", "--size", "1MiB", "--iterations", "300",
                             "--idle-ms", "100", "--out", str(out), "--no-plots"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    with group_killed_on_exit(proc):
        progress = out / "workload" / "progress.jsonl"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (progress.exists() and progress.read_text().count("end") >= 2):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        assert progress.exists(), "the job never ran"
        assert processes_mentioning(str(out / "workload")), "no rank running when signalled"
        err = sigterm_and_wait(proc)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by signal 15" in err
    assert leftovers(prefix) == {"namespaces": [], "mounts": [], "state": False, "lock": False}
    assert processes_mentioning(str(out / "workload")) == []          # no rank left behind


def caps(pid: int) -> tuple[int, int]:
    """(effective, bounding) capability masks of a process."""
    got = {}
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("CapEff:", "CapBnd:")):
            got[line[:6]] = int(line.split()[1], 16)
    return got.get("CapEff", -1), got.get("CapBnd", -1)


def test_sigterm_to_agent_stops_it_cleanly_and_leaves_the_testbed(make_testbed, tmp_path):
    from agent.privileges import TESTBED_AGENT, mask_of

    tb = make_testbed(leaves=2, spines=2, hosts_per_leaf=1)
    proc = subprocess.Popen([sys.executable, "-m", "flowpulse", "agent", "--prefix", tb.prefix, "--all",
                             "--duration", "120", "--alerts", str(tmp_path / "alerts.jsonl")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        pids = tb.dir / "pids"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(pids.glob("*.pid")):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        assert list(pids.glob(f"agent-{proc.pid}.pid")), "the agent wrote no pid file"
        # once its maps are open it keeps only CAP_BPF and CAP_SYS_NICE (agent/privileges.py)
        want = mask_of(TESTBED_AGENT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and caps(proc.pid) != (want, want):
            time.sleep(0.1)
        assert caps(proc.pid) == (want, want), caps(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert not list((tb.dir / "pids").glob("*.pid"))                  # its pid file went with it
    assert len(list_testbeds()[tb.prefix]) == len(tb.fabric.nodes)     # the testbed is not the agent's
