"""A self-signed certificate for 127.0.0.1 and a web config file with one basic-auth user (tests of the
agent's HTTP endpoint)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import bcrypt

USER, PASSWORD = "prometheus", "s3cret"


def make_tls(d: Path) -> Path:
    """``d``/agent.crt, agent.key and web.yml (TLS with them, basic auth USER:PASSWORD); returns ``d``."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(d / "agent.key"), "-out", str(d / "agent.crt")], check=True, capture_output=True)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (d / "web.yml").write_text(f"tls_server_config:\n  cert_file: agent.crt\n  key_file: agent.key\n"
                               f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    return d
