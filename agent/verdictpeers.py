"""Verdicts from the other switches' agents over HTTP: no shared file system.

Each agent serves its switch's verdict document at ``/verdicts/<switch>`` on its metrics endpoint (the
same text as its verdict file; behind ``--web-config``'s TLS and basic auth when it has one). A site file
lists where the peers are::

    peers:
      spine0: https://10.0.0.10:9580
      spine1: https://10.0.0.11:9580
    peer_ca_file: /etc/flowpulse/tls/agents-ca.crt      # the CA that signed the peers' certificates
    peer_user: flowpulse                                # basic auth towards the peers (optional)
    peer_password_file: /etc/flowpulse/peer-password
    peer_timeout_s: 1                                   # a peer slower than this gives no verdict this time

and the incident tracker asks a peer when an incident needs its verdict (:class:`VerdictPeers`). What
comes back is checked as a file is (``agent.incidents.check_verdict``: schema, owner, time, the fabric's
verdict key): TLS says who answered, the key says which agents wrote it. A peer that does not answer
gives no verdict (the incident waits, as for a stopped owner), logged once until it answers again, and is
asked again only every RETRY_S seconds: the tracker asks from the poll loop, which waits for the answer.
"""
from __future__ import annotations

import base64
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from agent.incidents import EvidenceSource, ExportedVerdicts
from netns_testbed.untrusted import text_of

log = logging.getLogger("flowpulse.agent.peers")
FETCH_TIMEOUT_S = 1.0      # default: a peer slower than this gives no verdict this time (site file: peer_timeout_s)
CACHE_S = 0.2              # one answer serves every question of one tracker tick
RETRY_S = 5.0              # a peer that did not answer is asked again after this (the poll loop waits on asks)
MAX_BYTES = 16 << 20


@dataclass
class PeerAccess:
    """Where the peers' agents answer, and how to reach them."""

    urls: dict[str, str]                      # switch -> base URL (http[s]://host:port)
    ca_file: Path | None = None
    user: str | None = None
    password: str | None = None
    timeout_s: float = FETCH_TIMEOUT_S        # the poll loop waits up to this on an ask
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)

    def context(self) -> ssl.SSLContext:
        if self._ctx is None:
            self._ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        return self._ctx

    def get(self, switch: str) -> str:
        """The peer's verdict document; FileNotFoundError if it has none or does not answer."""
        url = self.urls.get(switch)
        if url is None:
            raise FileNotFoundError(switch)
        req = urllib.request.Request(f"{url.rstrip('/')}/verdicts/{switch}")
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        ctx = self.context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx) as r:
                body = r.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise FileNotFoundError(switch) from None
            raise PeerUnreachable(f"{url}: HTTP {e.code}") from None
        except (urllib.error.URLError, OSError, ssl.SSLError) as e:
            raise PeerUnreachable(f"{url}: {getattr(e, 'reason', None) or e}") from None
        return text_of(body, MAX_BYTES)


class PeerUnreachable(Exception):
    """A peer that did not answer (down, refused, TLS failed, wrong credentials)."""


class VerdictPeers(ExportedVerdicts):
    """The owners' verdicts asked of their agents over HTTP (PeerAccess), checked as files are."""

    def __init__(self, access: PeerAccess, local: EvidenceSource | None = None, max_age_s: float = 30.0,
                 key: bytes | None = None) -> None:
        super().__init__(local, max_age_s, key)
        self.access = access
        self._cache: dict[str, tuple[float, str]] = {}
        self._down: dict[str, float] = {}       # peer that did not answer -> when to ask it again (monotonic)
        self._lock = threading.Lock()

    def origin(self, owner: str) -> str:
        return f"{self.access.urls.get(owner, '(no peer)')}/verdicts/{owner}"

    def fetch(self, owner: str) -> str:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(owner)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        if now < self._down.get(owner, 0.0):
            raise FileNotFoundError(owner)
        try:
            text = self.access.get(owner)
        except PeerUnreachable as e:
            if owner not in self._down:
                log.warning("no verdicts from %s: %s (asked again every %.0f s)", owner, e, RETRY_S)
            self._down[owner] = time.monotonic() + RETRY_S
            raise FileNotFoundError(owner) from None
        if self._down.pop(owner, None) is not None:
            log.info("%s's agent answers again", owner)
        with self._lock:
            self._cache[owner] = (now, text)
        return text
