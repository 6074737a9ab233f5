"""Verdicts asked of the owners' agents over HTTP (agent/verdictpeers.py): no shared file system. The
answer is checked as a file is; TLS and basic auth say who may ask and who answered, the verdict key
who wrote it."""
from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import yaml

from agent.incidents import VerdictFiles, verdict_document, write_verdicts
from agent.metrics import serve
from agent.site import load_site, site_of_testbed
from agent.verdictauth import ensure_key
from agent.site import SCHEMA_PATH, Site
from agent.verdictpeers import FETCH_TIMEOUT_S, PeerAccess, VerdictPeers
from agent.webconfig import load_web_config
from netns_testbed.errors import SpecError
from netns_testbed.untrusted import REFUSED
from tests.standins import free_port, idle_agent
from tests.test_verdict_auth import FABRIC, LINK, spine_with_evidence
from tests.tlsutil import PASSWORD, USER, make_tls


@pytest.fixture(scope="module")
def spine1(tmp_path_factory):
    """spine1's agent, with ten pulses of a 1% loss on leaf1->spine1 in its ledger, serving over TLS with
    basic auth; its verdicts signed with the fabric's key."""
    d = tmp_path_factory.mktemp("peer")
    tls = make_tls(d)
    key = ensure_key(d / "keys" / "verdict.key")
    agent = idle_agent(d, FABRIC, "spine1", verdict_key=key)
    agent.detector = spine_with_evidence()
    agent.verdict_doc = write_verdicts(d / "verdicts", agent.detector, key)
    port = free_port()
    serve([agent], port, "127.0.0.1", web=load_web_config(tls / "web.yml"))
    return {"agent": agent, "url": f"https://127.0.0.1:{port}", "tls": tls, "key": key, "dir": d}


def peers(p, **kw) -> VerdictPeers:
    access = PeerAccess({"spine1": p["url"]}, p["tls"] / "agent.crt", kw.get("user", USER),
                        kw.get("password", PASSWORD))
    return VerdictPeers(access, key=kw.get("key", p["key"]))


def test_a_peer_gives_the_evidence_its_file_would(spine1):
    got = peers(spine1).evidence("spine1", LINK, 0.0, 0.01)
    from_file = VerdictFiles(spine1["dir"] / "verdicts", key=spine1["key"]).evidence("spine1", LINK, 0.0, 0.01)
    assert got is not None and got == from_file and 0.005 < got.rate < 0.02


@pytest.mark.parametrize("how", ["no credentials", "wrong password", "not its CA", "no such peer", "peer down"])
def test_a_peer_that_cannot_be_asked_gives_no_verdict(spine1, how, tmp_path, caplog):
    kw = {}
    if how == "no credentials":
        kw = {"user": None}
    elif how == "wrong password":
        kw = {"password": "guess"}
    src = peers(spine1, **kw)
    if how == "not its CA":
        src.access.ca_file = make_tls(tmp_path) / "agent.crt"          # another self-signed certificate
    elif how == "no such peer":
        src.access.urls = {}
    elif how == "peer down":
        src.access.urls = {"spine1": f"https://127.0.0.1:{free_port()}"}
    before = REFUSED.snapshot().get("verdict", 0)
    with caplog.at_level("WARNING"):
        assert src.evidence("spine1", LINK, 0.0, 0.01) is None
        assert src.evidence("spine1", LINK, 0.0, 0.01) is None
    assert REFUSED.snapshot().get("verdict", 0) == before          # not bad input: no answer
    said = [r.getMessage() for r in caplog.records if "no verdicts from spine1" in r.getMessage()]
    assert len(said) == (0 if how == "no such peer" else 1), said     # once, not at every question


def test_a_forged_answer_is_refused_and_counted(spine1):
    real = spine1["agent"].verdict_doc
    try:
        spine1["agent"].verdict_doc = verdict_document(spine1["agent"].detector, os.urandom(32))   # not the key
        before = REFUSED.snapshot().get("verdict", 0)
        assert peers(spine1).evidence("spine1", LINK, 0.0, 0.01) is None
        assert REFUSED.snapshot().get("verdict", 0) == before + 1
    finally:
        spine1["agent"].verdict_doc = real


def test_site_files_name_their_peers(tmp_path):
    tb = SimpleNamespace(fabric=FABRIC, state=SimpleNamespace(gap_ms=50.0, spray="rrdst", weights={}),
                         out_of_service=[])
    data = site_of_testbed(tb, "leaf1")
    (tmp_path / "pw").write_text("s3cret\n")
    data.update(peers={"spine1": "https://10.0.0.11:9580"}, peer_ca_file="ca.crt", peer_user="flowpulse",
                peer_password_file="pw")
    (tmp_path / "leaf1.yaml").write_text(yaml.safe_dump(data))
    access = load_site(tmp_path / "leaf1.yaml").peer_access()
    assert access.urls == {"spine1": "https://10.0.0.11:9580"} and access.password == "s3cret"
    assert access.ca_file == tmp_path / "ca.crt"
    for bad, word in ((dict(peers={"spine9": "https://a:1"}), "peers.spine9"),
                      (dict(peers={"spine1": "ftp://a"}), "does not match")):
        data2 = {**data, **bad}
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data2))
        with pytest.raises(SpecError, match=word):
            load_site(tmp_path / "bad.yaml")


@pytest.fixture
def slow_peer(spine1):
    """spine1's verdict document served over plain HTTP by a peer that takes 0.6 s to answer."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    doc = spine1["agent"].verdict_doc.encode()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(0.6)
            self.send_response(200)
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("timeout_s, answers", [(0.2, False), (3.0, True)])
def test_a_slow_peer_answers_within_the_site_files_timeout_and_not_past_it(spine1, slow_peer, timeout_s, answers,
                                                                           caplog):
    """A peer slower than peer_timeout_s gives no verdict (logged once); a longer timeout waits for it (an
    emulated guest's agents took over the 1 s default to answer over TLS under load)."""
    src = VerdictPeers(PeerAccess({"spine1": slow_peer}, timeout_s=timeout_s), key=spine1["key"])
    with caplog.at_level("WARNING"):
        got = src.evidence("spine1", LINK, 0.0, 0.01)
    said = [r.getMessage() for r in caplog.records if "no verdicts from spine1" in r.getMessage()]
    if answers:
        assert got is not None and 0.005 < got.rate < 0.02 and not said
    else:
        assert got is None and len(said) == 1 and "timed out" in said[0], said


def test_site_files_set_the_peer_timeout_and_refuse_a_bad_one(tmp_path):
    tb = SimpleNamespace(fabric=FABRIC, state=SimpleNamespace(gap_ms=50.0, spray="rrdst", weights={}),
                         out_of_service=[])
    data = {**site_of_testbed(tb, "leaf1"), "peers": {"spine1": "https://10.0.0.11:9580"}}
    (tmp_path / "leaf1.yaml").write_text(yaml.safe_dump(data))
    # one default, said three times: the schema (and so the docs), the site, the access
    schema_default = json.loads(SCHEMA_PATH.read_text())["properties"]["peer_timeout_s"]["default"]
    assert schema_default == Site.peer_timeout_s == FETCH_TIMEOUT_S == PeerAccess({}).timeout_s
    assert load_site(tmp_path / "leaf1.yaml").peer_access().timeout_s == FETCH_TIMEOUT_S
    (tmp_path / "leaf1.yaml").write_text(yaml.safe_dump({**data, "peer_timeout_s": 7.5}))
    assert load_site(tmp_path / "leaf1.yaml").peer_access().timeout_s == 7.5
    for bad in (0, -1, 61, "soon", True):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**data, "peer_timeout_s": bad}))
        with pytest.raises(SpecError, match="peer_timeout_s"):
            load_site(tmp_path / "bad.yaml")


def test_the_endpoint_says_404_for_a_switch_it_does_not_serve(spine1):
    ctx = ssl.create_default_context(cafile=str(spine1["tls"] / "agent.crt"))
    req = urllib.request.Request(f"{spine1['url']}/verdicts/spine0")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, context=ctx, timeout=5)
    assert e.value.code == 404
