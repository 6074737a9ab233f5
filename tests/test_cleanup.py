"""What the tests build goes away even when a run is stopped: SIGTERM unwinds it at once, SIGKILL leaves
it to the next run's sweep (root; a pytest inside pytest, one short live test)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
