"""The slowdown factor (netns_testbed/slowdown.py): unset is 1, a measured factor stretches every hang
guard (job deadlines, the tests' waits), a bad value is refused before anything is built."""
from __future__ import annotations

import pytest

from netns_testbed.errors import SpecError
from netns_testbed.slowdown import ENV, factor_against, main, slowdown
from netns_testbed.topo import Fabric, FabricSpec
from workload.launcher import JobSpec


def test_unset_or_empty_is_one(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert slowdown() == 1.0
    monkeypatch.setenv(ENV, " ")
    assert slowdown() == 1.0


@pytest.mark.parametrize("raw,word", [("abc", "not a number"), ("0.5", "out of range"), ("nan", "out of range"),
                                      ("inf", "out of range"), ("1e9", "out of range")])
def test_a_bad_factor_is_one_line_naming_the_fix(monkeypatch, raw, word):
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(SpecError, match=word) as e:
        slowdown()
    assert "\n" not in str(e.value) and ENV in str(e.value)


def test_a_job_deadline_stretches_by_the_factor_and_a_bad_one_stops_validation(monkeypatch):
    spec = JobSpec("allreduce", size=4 << 20, iterations=40)
    monkeypatch.delenv(ENV, raising=False)
    base = spec.deadline
    monkeypatch.setenv(ENV, "12.5")
    assert spec.deadline == pytest.approx(12.5 * base)
    assert JobSpec("allreduce", deadline_s=60).deadline == pytest.approx(750)
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(SpecError, match=ENV):
        spec.validate(Fabric(FabricSpec()))


def test_the_factor_against_a_reference_is_at_least_one():
    assert factor_against(0.1, 2.0) == pytest.approx(20)
    assert factor_against(0.1, 0.05) == 1.0
    assert factor_against(1e-9, 10) == 200.0


def test_the_command_prints_seconds_or_a_factor(capsys):
    assert main([]) == 0
    here = float(capsys.readouterr().out)
    assert 0 < here < 60
    assert main(["--against", str(here / 4)]) == 0
    assert float(capsys.readouterr().out) >= 1.0
    with pytest.raises(SystemExit) as e:
        main(["--against", "0"])
    assert e.value.code == 2


def test_namespace_children_get_the_hang_guard_stretched_and_never_less(monkeypatch):
    """pyroute2 waits 2 s for the child that creates a namespace; the builder gives it the hang guard
    (tests/test_fabric.py has the rebuild it failed), times the slowdown, and never shortens a longer one."""
    import pyroute2.config as pyroute2_config

    from netns_testbed.nsutil import NETNS_CHILD_TIMEOUT_S, allow_netns_children

    monkeypatch.setattr(pyroute2_config, "default_communicate_timeout", 2)
    allow_netns_children(3.0)
    assert pyroute2_config.default_communicate_timeout == 3.0 * NETNS_CHILD_TIMEOUT_S
    allow_netns_children(1.0)
    assert pyroute2_config.default_communicate_timeout == 3.0 * NETNS_CHILD_TIMEOUT_S
