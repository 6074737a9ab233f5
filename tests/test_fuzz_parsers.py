"""Every parser of outside input, fed generated input (hypothesis): it either returns a value or refuses
with its one documented error; never another exception, never a crash.

Inputs are of three kinds: arbitrary text or JSON values; text built from the format's own pieces
(links, kinds, rates, suffixes) so that most of it gets deep into the parser; and a valid document with
one part replaced by an arbitrary value (mutations), which is how a truncated, hand-edited or hostile
file looks.

Each parser gets FUZZ_EXAMPLES inputs (2,000 by default) from a fixed seed (``derandomize``: the same
inputs on every run, so CI is repeatable); ``FLOWPULSE_FUZZ_EXAMPLES=20000 FLOWPULSE_FUZZ_RANDOM=1``
runs more, and new ones, by hand (new inputs find more than old ones repeated). The default was 10,000
until the test command's time had to come down: the cost is hypothesis drawing the inputs (nested JSON
values), not the parsers, about 6 ms an input, so 10,000 cost the test command's first pass about 420
of its ~950 CPU-seconds for the same inputs on every run (which every test command up to the cut
passed).

"The same inputs on every run" needs one more thing: hypothesis (since 6.131) also draws literal constants
harvested from the project's modules that are loaded when it draws, so which tests ran before in the same
process changed the inputs (a serial run and CI's ``-n 2`` workers drew different ones: the
``fa_per_day`` overflow failed in a fresh clone's run and passed serially in the tree). This module
imports every module of the project first (:func:`load_the_project`): the inputs are then a function of
hypothesis's version and the project's code alone, whatever runs beside them.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
import pkgutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.detector import DetectorConfig, SwitchDetector
from agent.feed import parse_header, parse_pulse
from agent.incidents import OtherFormat, VerdictFiles, check_verdict, write_verdicts
from agent.site import check_schema, site_from_dict, site_of_testbed
from analysis.rundir import load_report
from analysis.spec import from_dict
from netns_testbed.errors import SpecError
from netns_testbed.faults import parse_fault
from netns_testbed.topo import Fabric, FabricSpec, Link, SprayMode
from netns_testbed.untrusted import BadInput
from workload.launcher import parse_size

PROJECT = ("agent", "analysis", "flowpulse", "guest", "netns_testbed", "workload")


def load_the_project() -> list[str]:
    """Import every module of the project's packages (a ``__main__`` aside) and return their names: the
    literal constants hypothesis draws from are then all of the project's, in any process."""
    names = []
    for top in PROJECT:
        for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
            if not m.name.endswith(".__main__"):
                importlib.import_module(m.name)
                names.append(m.name)
    return names


LOADED = load_the_project()


def test_every_module_of_the_project_is_loaded_before_the_inputs_are_drawn():
    """A module the walk misses (a directory without ``__init__.py``) would put its constants in the pool
    only when some other test imports it: the inputs would again depend on what ran before."""
    root = Path(__file__).resolve().parent.parent
    files = {".".join(p.relative_to(root).with_suffix("").parts) for top in PROJECT for p in (root / top).rglob("*.py")}
    files = {f.removesuffix(".__init__") for f in files if not f.endswith(".__main__")}
    assert files - set(PROJECT) == set(LOADED), sorted(files.symmetric_difference(set(LOADED) | set(PROJECT)))


DRAW = """
import hashlib, importlib, sys
sys.path.insert(0, "tests")
for m in sys.argv[1:]:
    importlib.import_module(m)          # as an earlier test in the same worker would have
import test_fuzz_parsers as T
from hypothesis import given, settings
h = hashlib.sha256()
@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(T.json_values)
def draw(v):
    h.update(repr(v).encode())
draw()
print(h.hexdigest())
"""


def test_the_fixed_seed_draws_the_same_inputs_whatever_ran_before():
    """Two processes, one of which imported project modules this module does not before it: the same
    inputs (without :func:`load_the_project` they differed)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    digests = {subprocess.run([sys.executable, "-c", DRAW, *mods], cwd=root, env=env, capture_output=True, text=True,
                              check=True).stdout for mods in ([], ["analysis.report", "workload.rank", "analysis.sweep"])}
    assert len(digests) == 1, digests


FUZZ_EXAMPLES = int(os.environ.get("FLOWPULSE_FUZZ_EXAMPLES", "2000"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, derandomize=os.environ.get("FLOWPULSE_FUZZ_RANDOM") != "1",
                deadline=None, database=None, suppress_health_check=list(HealthCheck))
FABRIC = Fabric(FabricSpec(leaves=4, spines=4, hosts_per_leaf=2))

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([10**400, -10**400])
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=5)
                           | st.dictionaries(st.text(max_size=12), kids, max_size=5), max_leaves=20)


def paths(doc, at=()):
    """Every location in a parsed document (as key paths)."""
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, at + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, at + (i,))


@st.composite
def mutated(draw, doc):
    """``doc`` with one location replaced by an arbitrary value, deleted, or given an extra key."""
    doc = copy.deepcopy(doc)
    locs = list(paths(doc))
    at = draw(st.sampled_from(locs))
    how = draw(st.sampled_from(["replace", "delete", "add"]))
    if not at:
        return draw(json_values) if how == "replace" else doc
    parent = doc
    for k in at[:-1]:
        parent = parent[k]
    if how == "replace":
        parent[at[-1]] = draw(json_values)
    elif how == "delete":
        del parent[at[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = draw(json_values)
    else:
        parent.append(draw(json_values))
    return doc


# -- fault specs and sizes -------------------------------------------------------------------
nodes = st.sampled_from(["leaf0", "leaf3", "leaf4", "spine0", "spine3", "spine9", "h0", "h7", "h8", "x", ""])
numbers = st.sampled_from(["0", "0.01", "1", "1.5", "-1", "nan", "inf", "-inf", "1e-300", "1e309", "x", "", "0x10"])
fault_text = st.builds(
    lambda a, arrow, b, kind, eq, rate, mods: f"{a}{arrow}{b}:{kind}{eq}{rate}{mods}",
    nodes, st.sampled_from(["->", "<->", "-", ">"]), nodes,
    st.sampled_from(["drop", "corrupt", "blackhole", "partial", "flap", "flapping", "loss", ""]),
    st.sampled_from(["=", "", "=="]), numbers,
    st.lists(st.builds(lambda k, v: f",{k}={v}", st.sampled_from(["src", "dst", "flows", "on", "off", "delay",
                                                                  "every", "x"]),
                       st.sampled_from(["h0", "h1/32", "10.1.0.0/16", "0.5", "nan", "1ms", "2s", "inf", ""])),
             max_size=3).map("".join))


@FUZZ
@given(st.one_of(st.text(max_size=60), fault_text))
def test_fault_specs(text):
    try:
        spec = parse_fault(FABRIC, text)
    except SpecError as e:
        assert "\n" not in str(e)
        return
    assert spec.link in FABRIC.links() or Link(spec.link.dst, spec.link.src) in FABRIC.links()
    assert 0 <= spec.rate <= 1


@FUZZ
@given(st.one_of(st.text(max_size=20), st.builds(lambda n, s: n + s, numbers,
                                                 st.sampled_from(["", "B", "K", "KiB", "M", "MiB", "G", "GiB"]))))
def test_sizes(text):
    try:
        parse_size(text)
    except SpecError:
        pass


# -- site files and experiment specs -----------------------------------------------------------
GOOD_SITE = site_of_testbed(type("TB", (), {"fabric": FABRIC, "out_of_service": [], "state": type(
    "S", (), {"gap_ms": 50.0, "spray": "rrdst", "weights": {}})()})(), "spine2")


def load_site_dict(data) -> None:
    from pathlib import Path

    path = Path("site.yaml")
    if not isinstance(data, dict):
        raise SpecError("not a mapping")
    check_schema(path, data)
    site_from_dict(path, data)


@FUZZ
@given(st.one_of(mutated(GOOD_SITE), json_values))
def test_site_files(data):
    try:
        load_site_dict(data)
    except SpecError as e:
        assert "\n" not in str(e)


GOOD_SPEC = {"fabric": {"leaves": 2, "spines": 2, "hosts_per_leaf": 2}, "spray": "rrdst", "gap_ms": 50,
             "workload": {"kind": "allreduce", "size": "1MiB", "iterations": 10, "idle_ms": 100},
             "out_of_service": ["leaf0<->spine1"], "faults": ["leaf1->spine0:drop=0.01@iter=3"],
             "detector": {"fa_per_day": 1, "magnitudes": [0.01, 0.02]}, "seed": 3,
             "mitigation": {"max_per_switch": 1, "canary_weight": 0.5}}


@FUZZ
@given(st.one_of(mutated(GOOD_SPEC), json_values))
def test_experiment_specs(data):
    try:
        from_dict(data).validate()
    except SpecError as e:
        assert "\n" not in str(e)


@settings(max_examples=max(FUZZ_EXAMPLES // 10, 100), derandomize=FUZZ.derandomize, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.one_of(st.text(max_size=200), mutated(GOOD_SPEC).map(lambda d: yaml.safe_dump(d))))
def test_experiment_spec_files(tmp_path_factory, text):
    from analysis.spec import load_yaml

    p = tmp_path_factory.getbasetemp() / "fuzz-spec.yaml"
    p.write_text(text)
    try:
        from_dict(load_yaml(p))
    except SpecError as e:
        assert "\n" not in str(e)


# -- the counts feed -----------------------------------------------------------------------------
HEADER = {"flowpulse_feed": 1, "fabric": FABRIC.spec.to_dict(), "spray": "rrdst", "out_of_service": []}
PULSE = {"switch": "spine0", "pulse": 3, "start_time": 1.0, "end_time": 1.2,
         "ip": [[[5, 5, 0, 0, 0, 0]] * 2] * 4, "bad": [[0, 0]] * 4}


@FUZZ
@given(st.one_of(st.text(max_size=80), mutated(HEADER).map(json.dumps)))
def test_feed_headers(text):
    try:
        parse_header(text)
    except SpecError:
        pass


@FUZZ
@given(st.one_of(st.text(max_size=80), mutated(PULSE).map(json.dumps), st.just("[" * 100000)))
def test_feed_pulses(text):
    try:
        parse_pulse(text, 2, FABRIC)
    except SpecError:
        pass


@pytest.mark.parametrize("key", ["ip", "bad", "start_time"])
def test_a_pulse_line_with_an_integer_beyond_a_floats_range_is_refused_with_its_one_error(key):
    """JSON integers have no bound (10**400 parses): converting one to a float raised OverflowError (numpy's
    for a count, math.isfinite's for a time), so a feed line carrying one stopped ``flowpulse feed``
    with a traceback instead of one line (exit 2). The fuzz tests' JSON values include such integers since."""
    d = copy.deepcopy(PULSE)
    if key == "start_time":
        d[key] = 10 ** 400
        said = "start_time and end_time are seconds"
    else:
        cell = d[key]
        while isinstance(cell[0], list):
            cell = cell[0]
        cell[0] = 10 ** 400
        said = f"'{key}' holds a count that is not a whole number >= 0"
    with pytest.raises(SpecError, match=said):
        parse_pulse(json.dumps(d), 2, FABRIC)


def test_settings_with_an_integer_beyond_a_floats_range_are_refused_with_their_one_error():
    """A detector setting or a canary weight of 10**400 (a spec file's YAML or JSON parses it): the range
    checks' ``math.isfinite`` raised OverflowError (found by the fuzz tests' wider integers in CI)."""
    from agent.mitigation import MitigationPolicy

    with pytest.raises(SpecError, match="bad detector setting fa_per_day"):
        DetectorConfig(fa_per_day=10 ** 400).validate()
    with pytest.raises(SpecError, match="--canary-weight"):
        MitigationPolicy(canary_weight=10 ** 400).validate()


# -- verdict files, reports, saved detector state: files other processes wrote -------------------
def good_verdict(tmp) -> dict:
    det = SwitchDetector(FABRIC, "spine1", DetectorConfig(), SprayMode.RRDST)
    n = det.owner.ledger.ncells
    det.owner.ledger.rows.append((1.0, np.ones(n), np.full(n, 100.0), np.zeros(n), np.ones(n, np.int64)))
    write_verdicts(tmp, det)
    return json.loads((tmp / "spine1.json").read_text())


@pytest.fixture(scope="module")
def verdict_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("verdicts")
    d.chmod(0o700)
    return d


def test_verdicts(verdict_dir):
    """Malformed verdict files (mutations of a real one, arbitrary JSON, arbitrary bytes): refused (counted),
    no verdict, no crash, in the reader and in the evidence an incident asks for."""
    from netns_testbed.untrusted import REFUSED

    good = good_verdict(verdict_dir)
    files = VerdictFiles(verdict_dir)
    link = Link("leaf0", "spine1")
    path = verdict_dir / "spine1.json"
    refused0 = REFUSED.snapshot().get("verdict", 0)
    seen = {"refused": 0, "read": 0, "other format": 0}

    @FUZZ
    @given(st.one_of(mutated(good).map(json.dumps), json_values.map(json.dumps), st.binary(max_size=200)))
    def run(content):
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        try:
            d = check_verdict(files.fetch("spine1"), "spine1")        # the reader's own path
        except (BadInput, OSError, OtherFormat) as e:
            ev = files.evidence("spine1", link, 0.0, 0.05)
            assert ev is None
            seen["other format" if isinstance(e, OtherFormat) else "refused"] += 1
            return
        seen["read"] += 1
        d["written"] = time.time()
        path.write_text(json.dumps(d))
        files.evidence("spine1", link, 0.0, 0.05)      # a file that holds to the format: read, without a crash

    run()
    assert seen["refused"] > FUZZ_EXAMPLES // 2
    assert REFUSED.snapshot().get("verdict", 0) - refused0 == seen["refused"]   # each refusal counted


def test_reports(tmp_path_factory):
    from analysis.replay import REPLAYED

    run_dir = tmp_path_factory.mktemp("report")
    base = {"version": 1, "spec": {"fabric": FABRIC.spec.to_dict(), "spray": "rrdst"},
            "faults": [{"link": "leaf0->spine1", "kind": "drop", "rate": 0.01, "start": 1.0, "end": 2.0}],
            "iterations": [{"index": 0, "start": 0.5, "end": 0.6}]}

    @FUZZ
    @given(st.one_of(mutated(base).map(json.dumps), st.text(max_size=50)))
    def run(text):
        (run_dir / "report.json").write_text(text)
        for parts in (None, REPLAYED):
            try:
                load_report(run_dir, parts)
            except SpecError as e:
                assert "\n" not in str(e)

    run()


def test_saved_detector_state(tmp_path_factory):
    from agent.daemon import BAD_STATE, read_saved_state

    d = tmp_path_factory.mktemp("state")
    det = SwitchDetector(FABRIC, "leaf1", DetectorConfig(), SprayMode.RRDST)
    good = det.state()
    good = json.loads(json.dumps(good))
    path = d / "leaf1.json"

    @settings(max_examples=max(FUZZ_EXAMPLES // 5, 100), derandomize=FUZZ.derandomize, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated(good))
    def run(doc):
        path.write_text(json.dumps(doc))
        fresh = SwitchDetector(FABRIC, "leaf1", DetectorConfig(), SprayMode.RRDST)
        try:
            fresh.load_state(read_saved_state(path))
        except BAD_STATE:
            pass

    run()


@pytest.mark.parametrize("part", ["poisson", "banks"])
def test_a_saved_state_with_an_integer_beyond_its_arrays_type_is_refused_and_the_agent_starts_afresh(tmp_path, part):
    """Found by a random campaign (20,000 inputs a parser): an onset of 2**64 raised OverflowError out of
    numpy, which the agent's restore did not take for a bad file, so the agent died at every start."""
    from netns_testbed.untrusted import REFUSED
    from tests.standins import idle_agent

    first = idle_agent(tmp_path, FABRIC, "leaf1")
    first.detector.pulses_used = 7
    first.save_state()
    path = first.state_path
    doc = json.loads(path.read_text())
    assert doc["pulses_used"] == 7
    onset = doc["poisson"]["onset"] if part == "poisson" else doc["banks"][0]["onset"]
    while isinstance(onset[0], list):
        onset = onset[0]
    onset[0] = 2 ** 64
    path.write_text(json.dumps(doc))
    before = REFUSED.snapshot().get("state", 0)
    again = idle_agent(tmp_path, FABRIC, "leaf1")
    assert again.detector.pulses_used == 0                       # afresh, nothing of the bad file kept
    assert REFUSED.snapshot().get("state", 0) == before + 1


GOOD_WEB = {"tls_server_config": {"cert_file": "agent.crt", "key_file": "agent.key",
                                  "client_auth_type": "NoClientCert"},
            "basic_auth_users": {"prometheus": "$2b$04$" + "a" * 53}}


def test_web_configs(tmp_path_factory):
    from agent.webconfig import load_web_config

    path = tmp_path_factory.mktemp("web") / "web.yml"

    @FUZZ
    @given(st.one_of(mutated(GOOD_WEB).map(yaml.safe_dump), st.text(max_size=80)))
    def run(text):
        path.write_text(text)
        try:
            load_web_config(path)
        except SpecError as e:
            assert "\n" not in str(e)

    run()
