"""Pid files prove whose process they name: `fabric down` signals an agent it started, never an
unrelated process that got a stale file's pid."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from netns_testbed import builder, pidfile


@pytest.fixture
def sleeper():
    # named like the processes a name match took for agents (ssh-agent, gpg-agent)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpg-agent"])
    yield p
    p.kill()
    p.wait()


def test_start_time_is_the_kernels(sleeper):
    assert pidfile.start_ticks(os.getpid()) is not None
    assert pidfile.start_ticks(sleeper.pid) >= pidfile.start_ticks(os.getpid())
    assert pidfile.start_ticks(2 ** 22 + 12345) is None


def test_a_stale_file_naming_a_reused_pid_signals_nothing(tmp_path, sleeper):
    """The file names the sleeper's pid with another start time (the process it was written for died
    and the pid came round again): the sleeper lives on and the stale file goes."""
    f = tmp_path / "agent-1.pid"
    f.write_text(f"{sleeper.pid} {pidfile.start_ticks(sleeper.pid) - 1} leaf0\n")
    assert pidfile.kill_owned([f], grace=0.1) == []
    time.sleep(0.2)
    assert sleeper.poll() is None and not f.exists()


def test_an_owned_process_is_stopped(tmp_path, sleeper):
    f = tmp_path / "agent-2.pid"
    pidfile.write(f, "leaf0 leaf1", pid=sleeper.pid)
    assert f.read_text().split()[2:] == ["leaf0", "leaf1"]
    assert pidfile.kill_owned([f], grace=2.0) == [sleeper.pid]
    assert sleeper.wait(timeout=5) == -15          # SIGTERM was enough


def test_files_are_exclusive_and_garbage_is_ignored(tmp_path):
    f = tmp_path / "a.pid"
    pidfile.write(f)
    with pytest.raises(FileExistsError):
        pidfile.write(f)
    bad = tmp_path / "b.pid"
    bad.write_text("not a pid\n")
    assert pidfile.read(bad) is None and pidfile.kill_owned([bad]) == []


@pytest.mark.root
def test_down_spares_an_unrelated_process_behind_a_stale_pidfile(make_testbed, sleeper):
    tb = make_testbed(leaves=2, spines=1, hosts_per_leaf=1, datapath=False)
    piddir = tb.dir / "pids"
    piddir.mkdir(exist_ok=True)
    (piddir / "agent-99.pid").write_text(f"{sleeper.pid} {pidfile.start_ticks(sleeper.pid) - 7} leaf0\n")
    builder.down(tb.prefix)
    time.sleep(0.2)
    assert sleeper.poll() is None, "down killed a process that was not the testbed's"
