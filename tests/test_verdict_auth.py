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
    n = det.ledger.ncells
    for i in range(10):
        q = np.zeros(n)
        q[1] = 0.01 * 4000
        det.ledger.rows.append((float(i), q, np.full(n, 4000.0), np.zeros(n), np.ones(n, np.int64)))
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
