"""Verdict files signed with the fabric's verdict key (agent/verdictauth.py): a reader that holds the key
takes no file without its MAC, with another key's, or changed after signing; each refusal is counted."""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from agent.detector import DetectorConfig, SwitchDetector
from agent.incidents import VerdictFiles, write_verdicts
from agent.verdictauth import KEY_BYTES, ensure_key, load_key
from netns_testbed.safefiles import UnsafePath
from netns_testbed.topo import Fabric, FabricSpec, Link, SprayMode
from netns_testbed.untrusted import REFUSED

FABRIC = Fabric(FabricSpec(leaves=4, spines=4, hosts_per_leaf=2))
LINK = Link("leaf1", "spine1")


def spine_with_evidence() -> SwitchDetector:
    """spine1 with ten pulses of a 1% loss on leaf1->spine1 in its ledger."""
    det = SwitchDetector(FABRIC, "spine1", DetectorConfig(), SprayMode.RRDST)
    n = det.owner.ledger.ncells
    for i in range(10):
        q = np.zeros(n)
        q[1] = 0.01 * 4000
        det.owner.ledger.rows.append((float(i), q, np.full(n, 4000.0), np.zeros(n), np.ones(n, np.int64)))
    return det


@pytest.fixture
def key(tmp_path) -> bytes:
    return ensure_key(tmp_path / "keys" / "verdict.key")


def refused() -> int:
    return REFUSED.snapshot().get("verdict", 0)


def test_a_signed_file_is_read_and_gives_the_same_evidence(tmp_path, key):
    det = spine_with_evidence()
    write_verdicts(tmp_path / "v", det, key)
    d = json.loads((tmp_path / "v" / "spine1.json").read_text())
    assert len(d["mac"]) == 64
    signed = VerdictFiles(tmp_path / "v", key=key).evidence("spine1", LINK, 0.0, 0.01)
    unsigned_reader = VerdictFiles(tmp_path / "v").evidence("spine1", LINK, 0.0, 0.01)   # no key: MAC ignored
    assert signed is not None and signed == unsigned_reader and 0.005 < signed.rate < 0.02


@pytest.mark.parametrize("forge", ["unsigned", "other key", "changed rate", "changed owner time", "mac moved"])
def test_a_forged_file_gives_no_verdict_and_is_counted(tmp_path, key, forge):
    det = spine_with_evidence()
    d = tmp_path / "v"
    if forge == "unsigned":
        write_verdicts(d, det)
    elif forge == "other key":
        write_verdicts(d, det, os.urandom(KEY_BYTES))
    else:
        write_verdicts(d, det, key)
        doc = json.loads((d / "spine1.json").read_text())
        if forge == "changed rate":
            doc["ledger"][-1][1][1] = 0.0                 # the upstream link now looks intact in its last pulse
        elif forge == "changed owner time":
            doc["written"] = time.time() + 1
        else:
            doc["mac"] = json.loads((d / "spine1.json").read_text())["mac"][::-1]
        (d / "spine1.json").write_text(json.dumps(doc))
    before = refused()
    assert VerdictFiles(d, key=key).evidence("spine1", LINK, 0.0, 0.01) is None
    assert refused() == before + 1


def test_keys_that_are_not_safe_are_refused(tmp_path):
    with pytest.raises(UnsafePath, match="does not exist"):
        load_key(tmp_path / "missing.key")
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    short.chmod(0o600)
    with pytest.raises(UnsafePath, match="fewer than 32"):
        load_key(short)
    shared = tmp_path / "shared.key"
    shared.write_bytes(os.urandom(32))
    shared.chmod(0o644)
    with pytest.raises(UnsafePath, match="chmod 600"):
        load_key(shared)
    good = tmp_path / "good.key"
    good.write_bytes(os.urandom(32))
    good.chmod(0o600)
    (tmp_path / "alias.key").symlink_to(good)
    with pytest.raises(UnsafePath, match="not a link"):
        load_key(tmp_path / "alias.key")


def test_agents_starting_together_share_one_key(tmp_path):
    path = tmp_path / "run" / "verdict.key"
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(ensure_key(path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys[0]) == KEY_BYTES
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == ["verdict.key"]


def test_a_forged_verdict_file_changes_no_incident(tmp_path):
    """A leaf's agent in its own process settles its ambiguous alert with spine1's verdict file. Someone who
    can write to the verdict directory replaces it after every pulse with one that says spine1's link from
    leaf1 is intact (its loss taken out of the ledger, its open alert out of the list), so that the leaf would blame the healthy
    spine1->leafM. A reader without the key believes it and names the wrong link; with the fabric's key
    the forged file is refused at every read (counted) and no link is named from it."""
    from agent.incidents import LocalEvidence, verdict_document
    from analysis.model import ModelSpec
    from analysis.modelrun import run_model

    key = ensure_key(tmp_path / "keys" / "verdict.key")
    d = tmp_path / "verdicts"
    d.mkdir(mode=0o700)
    fault = "leaf1->spine1"

    def forge(i: int, dets: dict) -> None:
        doc = json.loads(verdict_document(dets["spine1"]))
        cells = [c for name, c in doc["cells"].items() if name == fault or name.startswith(fault + "->")]
        for cell in cells:                        # the link's cell and its cells per destination leaf
            for row in doc["ledger"]:
                row[1][cell] = 0.0                # no deficit: "intact"
        doc["open_links"] = []                    # and no alert open on it
        (d / "spine1.json").write_text(json.dumps(doc))          # no MAC: the writer has no key

    def run(reader_key: bytes | None):
        def evidence(dets):     # the leaves' own detectors in process; spine1 only through its file
            local = LocalEvidence(lambda: {sw: det for sw, det in dets.items() if sw != "spine1"})
            return VerdictFiles(d, local, key=reader_key)

        return run_model(ModelSpec(size=16 << 20, seed=7), 40, {20: {"drop": {fault: 0.02}}}, evidence=evidence,
                         on_pulse=forge, fed={sw for sw in FABRIC.switches if sw.startswith("leaf")})

    fooled = run(None)
    wrong = {e["link"] for e in fooled.incidents if e.get("link")}
    assert wrong and fault not in wrong, fooled.incidents             # the attack works without the key
    before = refused()
    keyed = run(key)
    assert {e["link"] for e in keyed.incidents if e.get("link")} == set(), keyed.incidents
    assert any(e["event"] == "open" for e in keyed.incidents)         # the fault is still an incident: localizing
    assert refused() > before
