"""Shared fixtures. Root tests build real testbeds with the prefix ``tf<pid%1000><n>``
(8 characters, unique within a run); leftovers of killed earlier runs (any ``tf*``
testbed) are removed at session start and end."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
TRACES = Path(__file__).parent / "data" / "pulse-traces"   # recorded runs shipped with the repository
_counter = itertools.count()


def pytest_collection_modifyitems(config, items):
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (builds network namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


def _test_prefixes() -> list[str]:
    from netns_testbed.builder import list_testbeds

    return [p for p in list_testbeds() if p.startswith("tf")]


@pytest.fixture(scope="session", autouse=True)
def _clean_leftovers():
    if IS_ROOT:
        from netns_testbed.builder import down

        for p in _test_prefixes():
            down(p)
    yield
    if IS_ROOT:
        from netns_testbed.builder import down

        for p in _test_prefixes():
            down(p)


def new_prefix() -> str:
    n = next(_counter)
    assert n < 1000, "test prefix space exhausted"
    return f"tf{os.getpid() % 1000:03d}{n:03d}"


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
