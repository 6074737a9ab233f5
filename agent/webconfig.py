"""TLS and basic authentication for the agent's HTTP endpoint, from a web config file.

The file follows the Prometheus exporters' convention (node_exporter's ``--web.config.file``), so one
file serves both and Prometheus' ``scrape_configs`` need nothing special::

    tls_server_config:
      cert_file: /etc/flowpulse/tls/agent.crt
      key_file: /etc/flowpulse/tls/agent.key
      client_ca_file: /etc/flowpulse/tls/scrapers-ca.crt    # optional: scrapers need a certificate of this CA
      client_auth_type: RequireAndVerifyClientCert           # or NoClientCert (default)
    basic_auth_users:
      prometheus: $2b$12$...                                 # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':')

Passwords are bcrypt hashes, checked with ``bcrypt``; a password that matched is remembered by its
SHA-256 so that a scrape a second does not cost a bcrypt round each. A request without valid
credentials gets 401 and nothing else.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from netns_testbed.errors import SpecError
from netns_testbed.untrusted import problem

SCHEMA = Path(__file__).with_name("webconfig.schema.json")
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}


@dataclass
class WebConfig:
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth: int = ssl.CERT_NONE
    users: dict[str, bytes] = field(default_factory=dict)     # user -> bcrypt hash
    _ok: set[bytes] = field(default_factory=set, repr=False)   # SHA-256 of "user:password" pairs that matched
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        ctx.verify_mode = self.client_auth
        return ctx

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries a user and password of the file (always, if it
        names no users)."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        digest = hashlib.sha256(f"{user}:{password}".encode()).digest()
        with self._lock:
            if any(hmac.compare_digest(digest, d) for d in self._ok):
                return True
        hashed = self.users.get(user)
        if hashed is None:
            return False
        import bcrypt

        try:
            good = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            return False
        if good:
            with self._lock:
                self._ok.add(digest)
        return good


def load_web_config(path: Path) -> WebConfig:
    """Read and check a web config file: its schema, the files it names readable, the certificate and
    key loadable together. One SpecError line naming the problem (exit 2)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"--web-config {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"--web-config {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise SpecError(f"--web-config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    data = {} if data is None else data
    bad = problem(SCHEMA, data)
    if bad is not None:
        raise SpecError(f"--web-config {path}: {bad}")
    tls = data.get("tls_server_config") or {}
    cfg = WebConfig(users={u: h.encode() for u, h in (data.get("basic_auth_users") or {}).items()})
    if tls:
        base = Path(path).parent
        files = {k: (Path(v) if Path(v).is_absolute() else base / v) for k, v in tls.items() if k.endswith("_file")}
        cfg.cert_file, cfg.key_file = files["cert_file"], files["key_file"]
        cfg.client_ca_file = files.get("client_ca_file")
        cfg.client_auth = CLIENT_AUTH[tls.get("client_auth_type", "NoClientCert")]
        if cfg.client_auth == ssl.CERT_REQUIRED and cfg.client_ca_file is None:
            raise SpecError(f"--web-config {path}: client_auth_type RequireAndVerifyClientCert needs client_ca_file")
        try:
            cfg.ssl_context()
        except (OSError, ssl.SSLError) as e:
            raise SpecError(f"--web-config {path}: the TLS files do not load ({getattr(e, 'strerror', None) or e})") \
                from None
    return cfg
