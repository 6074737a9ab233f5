"""Files the agents write where another user may have been first (netns_testbed/safefiles.py): a planted
symlink is never followed, by any writer; a directory another user owns or can write is refused."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agent.daemon import JsonLinesSink, SwitchAgent
from agent.detector import DetectorConfig, SwitchDetector
from agent.incidents import write_verdicts
from netns_testbed.safefiles import UnsafePath, open_append, read_bounded, secure_dir, write_atomic
from netns_testbed.topo import Fabric, FabricSpec, SprayMode
from netns_testbed.untrusted import BadInput
from tests.standins import IdleReader, idle_agent

FABRIC = Fabric(FabricSpec(leaves=2, spines=2, hosts_per_leaf=2))


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file an attacker would like overwritten (outside the directory written into)."""
    v = tmp_path / "victim"
    v.write_text("precious\n")
    return v


def planted(directory: Path, name: str, target: Path) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    link = directory / name
    link.symlink_to(target)
    return link


def intact(victim: Path) -> None:
    assert victim.read_text() == "precious\n"


def test_write_atomic_replaces_a_planted_link_without_following_it(tmp_path, victim):
    link = planted(tmp_path / "d", "state.json", victim)
    write_atomic(link, '{"a": 1}')
    intact(victim)
    assert not link.is_symlink() and json.loads(link.read_text()) == {"a": 1}
    assert stat.S_IMODE(link.stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["state.json"]     # no temporary left


def test_open_append_refuses_a_planted_link(tmp_path, victim):
    link = planted(tmp_path / "d", "alerts.jsonl", victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        open_append(link)
    intact(victim)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    for call in (lambda: write_atomic(d / "x.json", "{}"), lambda: open_append(d / "x.jsonl"), lambda: secure_dir(d)):
        with pytest.raises(UnsafePath, match="writable by other users"):
            call()
    assert list(d.iterdir()) == []


def test_a_directory_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "alias").symlink_to(real)
    with pytest.raises(UnsafePath, match="symbolic link"):
        write_atomic(tmp_path / "alias" / "x.json", "{}")
    assert list(real.iterdir()) == []


def test_sticky_directories_above_are_fine_and_new_ones_are_private(tmp_path):
    top = tmp_path / "tmp-like"
    top.mkdir()
    top.chmod(0o1777)                  # like /tmp: others write here, but cannot touch what is not theirs
    write_atomic(top / "a" / "b" / "v.json", "{}")
    for d in (top / "a", top / "a" / "b"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    with pytest.raises(UnsafePath):
        write_atomic(top / "v.json", "{}")          # the sticky directory itself is not one's own


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another user's directory (root makes one)")
def test_another_users_directory_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(UnsafePath, match="belongs to uid 65534"):
        write_atomic(d / "x.json", "{}")


def test_read_bounded_refuses_links_devices_and_huge_files(tmp_path, victim):
    link = planted(tmp_path / "d", "v.json", victim)
    with pytest.raises(OSError):
        read_bounded(link)
    with pytest.raises(OSError, match="not a regular file"):
        read_bounded("/dev/zero")
    big = tmp_path / "big"
    big.write_bytes(b"0" * 2048)
    with pytest.raises(BadInput, match="larger than 1024"):
        read_bounded(big, limit=1024)


# -- each writer of the agents ---------------------------------------------------------------------
def agent(tmp_path: Path, record: Path | None = None) -> SwitchAgent:
    return idle_agent(tmp_path, FABRIC, "spine1", record=record)


def test_detector_state_writer(tmp_path, victim):
    a = agent(tmp_path)
    link = planted(tmp_path / "state", "spine1.json", victim)
    planted(tmp_path / "state", f"spine1.tmp{os.getpid()}", victim)    # where the temporary file once was
    a.save_state()
    intact(victim)
    assert not link.is_symlink() and "identity" in json.loads(link.read_text())


def test_verdict_writer(tmp_path, victim):
    det = SwitchDetector(FABRIC, "spine1", DetectorConfig(), SprayMode.RRDST)
    link = planted(tmp_path / "verdicts", "spine1.json", victim)
    planted(tmp_path / "verdicts", f"spine1.tmp{os.getpid()}", victim)
    write_verdicts(tmp_path / "verdicts", det)
    intact(victim)
    assert not link.is_symlink() and json.loads(link.read_text())["switch"] == "spine1"


def test_pulse_recorder(tmp_path, victim):
    planted(tmp_path / "rec", "pulses-spine1.jsonl", victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        agent(tmp_path, record=tmp_path / "rec")
    intact(victim)


def test_alert_and_incident_logs(tmp_path, victim):
    link = planted(tmp_path / "logs", "alerts.jsonl", victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        JsonLinesSink(link)
    intact(victim)
    # planted after the agent opened its log, while it rotates (moved away, a link in its place)
    path = tmp_path / "logs" / "incidents.jsonl"
    sink = JsonLinesSink(path)
    sink({"event": "open"})
    path.rename(tmp_path / "logs" / "incidents.jsonl.1")
    path.symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        sink({"event": "update"})
    sink.close()
    intact(victim)


def test_testbed_state_writer(tmp_path, victim, monkeypatch):
    from netns_testbed import state as st

    monkeypatch.setattr(st, "RUN_DIR", tmp_path / "run")
    s = st.TestbedState(prefix="tsafe", fabric=FABRIC.to_dict())
    planted(tmp_path / "run" / "tsafe", "state.json", victim)
    st.write_state(s)
    intact(victim)
    assert json.loads((tmp_path / "run" / "tsafe" / "state.json").read_text())["prefix"] == "tsafe"


# -- an agent whose poll raises ------------------------------------------------------------------
class _Failing(IdleReader):
    def __init__(self, fail: int) -> None:
        self.fail, self.calls = fail, 0

    def poll(self):
        self.calls += 1
        if self.calls <= self.fail:
            raise ValueError(f"broken pulse {self.calls}")
        return None


def test_a_poll_that_raises_is_logged_counted_and_survived(tmp_path, caplog):
    import threading

    from agent.daemon import MAX_ERRORS_IN_ROW, run_agents
    from agent.metrics import AgentCollector

    a = agent(tmp_path)
    a.reader = _Failing(3)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with caplog.at_level("ERROR"):
        run_agents([a], stop, poll_s=0.005)              # returns at stop: three errors did not end it
    assert a.errors == 3 and a.errors_in_row == 0 and a.reader.calls > 3
    said = [r for r in caplog.records if "poll failed" in r.getMessage()]
    assert len(said) == 3 and all(r.exc_info for r in said)          # each with its traceback
    fams = {f.name: f for f in AgentCollector([a]).collect()}
    assert [s.value for s in fams["flowpulse_agent_errors"].samples if s.name.endswith("_total")] == [3]
    assert "flowpulse_last_pulse_age_seconds" in fams and "flowpulse_build" in fams

    b = agent(tmp_path / "b")
    b.reader = _Failing(10 ** 9)
    with pytest.raises(ValueError, match="broken pulse"):
        run_agents([b], threading.Event(), poll_s=0.0)     # never recovers: it gives up, for a restart
    assert b.errors == MAX_ERRORS_IN_ROW
