"""The agent's metrics endpoint over TLS with basic auth (--web-config, the exporters' format): scraped
with the credentials and the CA, refused without them; a bounded number of connections at once."""
from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.metrics import MAX_CONNECTIONS, serve
from agent.webconfig import load_web_config
from netns_testbed.errors import SpecError
from netns_testbed.topo import Fabric, FabricSpec
from tests.standins import free_port, idle_agent
from tests.tlsutil import make_tls

FABRIC = Fabric(FabricSpec(leaves=2, spines=2, hosts_per_leaf=2))


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Path:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def endpoint(tls, tmp_path_factory):
    agent = idle_agent(tmp_path_factory.mktemp("agent"), FABRIC, "spine0")
    port = free_port()
    serve([agent], port, "127.0.0.1", web=load_web_config(tls / "web.yml"))
    return port


def get(port: int, tls_dir: Path, auth: str | None, path: str = "/metrics"):
    ctx = ssl.create_default_context(cafile=str(tls_dir / "agent.crt"))
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    return urllib.request.urlopen(req, context=ctx, timeout=10)


def test_a_scrape_over_tls_with_the_credentials(endpoint, tls):
    body = get(endpoint, tls, "prometheus:s3cret").read().decode()
    assert 'flowpulse_build_info{version="' in body and "process_cpu_seconds_total" in body
    assert 'flowpulse_last_poll_age_seconds{switch="spine0"}' in body
    assert get(endpoint, tls, "prometheus:s3cret", "/healthz").status == 200


@pytest.mark.parametrize("auth", [None, "prometheus:wrong", "nobody:s3cret", "prometheus"])
def test_refused_without_the_credentials(endpoint, tls, auth):
    with pytest.raises(urllib.error.HTTPError) as e:
        get(endpoint, tls, auth)
    assert e.value.code == 401 and e.value.headers["WWW-Authenticate"].startswith("Basic")


def test_refused_in_plain_http(endpoint):
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint}/metrics", timeout=5).read()


def test_connections_are_bounded(endpoint, tls):
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", endpoint)) for _ in range(MAX_CONNECTIONS * 3)]
    time.sleep(0.5)
    assert threading.active_count() - before <= MAX_CONNECTIONS
    for s in idle:
        s.close()
    deadline = time.monotonic() + 15
    while True:                   # the slots come back as the server sees the sockets closed
        try:
            assert get(endpoint, tls, "prometheus:s3cret").status == 200
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            assert time.monotonic() < deadline
            time.sleep(0.2)


@pytest.mark.parametrize("text,word", [
    ("tls_server_config: {cert_file: a.crt}\n", "'key_file' is a required property"),
    ("basic_auth_users: {prometheus: plaintext}\n", "does not match"),
    ("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n", "do not load"),
    ("colour: blue\n", "unknown field(s) ['colour']"),
    ("tls_server_config: [1]\n", "is not of type 'object'"),
])
def test_a_bad_web_config_is_one_line(tmp_path, text, word):
    (tmp_path / "web.yml").write_text(text)
    with pytest.raises(SpecError) as e:
        load_web_config(tmp_path / "web.yml")
    assert word in str(e.value) and "\n" not in str(e.value), str(e.value)
