"""Experiment specs and flags: clear one-line errors before anything is built."""
from __future__ import annotations

import subprocess
import sys

import pytest

from analysis.spec import from_dict, parse_scheduled
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowpulse", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags,word", [
    (["--fault", "leaf1->spine9:drop=0.01@iter=3"], "unknown node 'spine9'"),
    (["--fault", "leaf1->spine2:drop=1.5@iter=3"], "[0, 1]"),
    (["--fault", "leaf1->spine2:drop=0.01@iter=50", "--iterations", "20"], "only 20"),
    (["--fault", "leaf1->spine2:drop=0.01@iter=2", "--fault", "leaf1->spine2:corrupt=0.1@iter=5"], "conflicting"),
    (["--fault", "leaf1->spine2:drop=0.01@when=2"], "bad fault start"),
    (["--fault", "leaf1->spine2:drop=0.01", "--out-of-service", "leaf1<->spine2"], "out of service"),
    (["--leaves", "0"], "bad leaves"),
    (["--ranks", "99"], "bad rank count"),
    (["--size", "1"], "bad size 1"),            # the job's own checks, made before the fabric is built
    (["--iterations", "0"], "bad iterations 0"),
    (["--idle-ms", "70000"], "bad idle 70000"),
])
def test_bad_flags(tmp_path, flags, word):
    r = cli("experiment", "--out", str(tmp_path / "run"), "--prefix", "tspec", *flags)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_out_that_holds_a_run_or_a_file_is_refused(tmp_path):
    """A second run into one --out appended to the first's alerts and pulses: refused, nothing written;
    --force replaces only run files."""
    from analysis.rundir import check_out, claim

    run = tmp_path / "run"
    (run / "pulses").mkdir(parents=True)
    (run / "alerts.jsonl").write_text("{}\n")
    (run / "fabric.png").write_bytes(b"png")
    r = cli("experiment", "--out", str(run), "--prefix", "tspec")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--force" in r.stderr, r.stderr
    assert (run / "alerts.jsonl").read_text() == "{}\n"
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = cli("experiment", "--out", str(afile), "--prefix", "tspec")
    assert r.returncode == 2 and "is a file" in r.stderr, r.stderr
    claim(run, force=True)
    assert list(run.iterdir()) == []
    (run / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="not a run's"):
        check_out(run, force=True)
    assert (run / "notes.txt").exists()
    check_out(tmp_path / "new", force=False)      # a new directory is fine


def test_a_replay_refuses_what_is_not_a_finished_run(tmp_path):
    """The benches that replay run directories check each one before reading any: report.json and pulses/."""
    from analysis.rundir import check_replayable

    run = tmp_path / "run"
    (run / "pulses").mkdir(parents=True)
    with pytest.raises(SpecError, match="not a run directory"):
        check_replayable(run)                      # no report.json yet: the run did not finish
    (run / "report.json").write_text("{}")
    check_replayable(run)
    with pytest.raises(SpecError, match="not a run directory"):
        check_replayable(tmp_path / "missing")


def test_bad_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("fabric: {leaves: 2\n")
    r = cli("experiment", "--spec", str(bad), "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    bad.write_text("fabric: {leaves: 2}\nwrkload: {}\n")
    r = cli("experiment", "--spec", str(bad), "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "unknown field(s) ['wrkload']: allowed are" in r.stderr


def test_yaml_and_flags_merge():
    spec = from_dict({"fabric": {"leaves": 2, "spines": 3, "hosts_per_leaf": 1}, "spray": "rr",
                      "workload": {"kind": "allreduce", "size": "1MiB", "iterations": 12},
                      "faults": ["leaf0->spine2:drop=0.02@iter=4", "spine1->leaf1:corrupt=0.015@t=3.5"]}).validate()
    assert spec.job.size == 1 << 20 and spec.spray == "rr"
    assert [f.at_iter for f in spec.faults] == [4, None] and spec.faults[1].at_t == 3.5


def test_scheduled_fault_parsing():
    fab = Fabric(FabricSpec())
    sf = parse_scheduled(fab, "leaf1->spine2:drop=0.01@iter=10")
    assert sf.fault.rate == 0.01 and sf.at_iter == 10
    assert parse_scheduled(fab, "spine0->leaf3:corrupt=0.015@t=12.5").at_t == 12.5
    assert parse_scheduled(fab, "h1->leaf0:blackhole").at_iter == 0
    with pytest.raises(SpecError):
        parse_scheduled(fab, "leaf1->spine2:drop=0.01@iter=-1")


def test_help_everywhere():
    for args in (["--help"], ["fabric", "up", "--help"], ["fault", "add", "--help"], ["counters", "--help"],
                 ["workload", "run", "--help"], ["agent", "--help"], ["experiment", "--help"], ["demo", "--help"],
                 ["report", "--help"], ["replay", "--help"]):
        r = cli(*args)
        assert r.returncode == 0 and "usage:" in r.stdout, args


def test_replay_cli_on_recorded_trace():
    from tests.conftest import TRACES

    r = cli("replay", str(TRACES / "f1_rrdst"), "--json")
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["detection"]["detected"] and out["detection"]["iterations_to_detect"] == 1
