"""workload.spawner without a fabric: failures before a rank runs are reported, never hang."""
from __future__ import annotations

import os
import time

from workload.launcher import Spawned


def wait_codes(sp: Spawned, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and None in sp.codes():
        time.sleep(0.05)
    return sp.codes()


def test_a_rank_that_cannot_enter_its_namespace_fails_with_the_reason_in_its_log(tmp_path):
    jobs = [{"rank": r, "netns": f"fp-no-such-ns{r}", "log": str(tmp_path / f"rank{r}.log"), "env": {}, "argv": []}
            for r in range(2)]
    sp = Spawned(jobs, dict(os.environ), tmp_path)
    try:
        assert wait_codes(sp) == [1, 1]
        assert len(sp.pids) == 2 and sp.exits == {0: 1, 1: 1}   # reported by the spawner, not inferred
    finally:
        sp.kill()
    for r in range(2):
        assert f"fp-no-such-ns{r}" in (tmp_path / f"rank{r}.log").read_text()


def test_a_spawner_killed_before_forking_fails_every_rank_with_its_status(tmp_path):
    jobs = [{"rank": r, "netns": "x", "log": str(tmp_path / f"rank{r}.log"), "env": {}, "argv": []} for r in range(3)]
    sp = Spawned(jobs, dict(os.environ), tmp_path)
    sp.proc.kill()                     # still importing torch: no rank forked yet
    try:
        assert wait_codes(sp) == [-9, -9, -9]
    finally:
        sp.kill()
    assert sp.pids == {}


def test_a_rank_killed_by_a_signal_it_was_not_sent_is_named_with_the_signal(tmp_path):
    """In a 3 GiB guest the OOM killer took a DDP rank: the job said only "exit -9"."""
    from workload.launcher import _failure_text

    (tmp_path / "rank4.log").write_text("[W socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved\n")
    text = _failure_text(tmp_path, 4, -9)
    assert text.startswith("killed by SIGKILL (the kernel's OOM killer, if dmesg says so): [W socket.cpp:207]"), text
    assert _failure_text(tmp_path, 4, -11).startswith("killed by SIGSEGV: "), _failure_text(tmp_path, 4, -11)
    assert _failure_text(tmp_path, 4, 1).startswith("exit 1: "), _failure_text(tmp_path, 4, 1)
