"""Prometheus export of the agents: a custom collector read at scrape time.

Nothing is stored twice: each scrape walks the agents' detectors and readers
(client_python's custom-collector pattern). Metric names start ``flowpulse_``.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from functools import lru_cache
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import CollectorRegistry

from agent.daemon import SwitchAgent
from agent.detector.alerts import AlertKind
from agent.faultcost import incident_costs
from agent.incidents import IncidentTracker
from agent.mitigation import Mitigator
from netns_testbed.untrusted import REFUSED

if TYPE_CHECKING:
    from agent.webconfig import WebConfig

BAD_INPUT_SOURCES = ("verdict", "state")   # every source a running agent refuses content from (REFUSED)


@lru_cache(maxsize=1)
def version() -> str:
    """The installed package's version, read once (flowpulse/__init__.py through the package metadata: the
    agent does not import the CLI package)."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("flowpulse")
    except PackageNotFoundError:
        return "unknown"


class AgentCollector:
    def __init__(self, agents: list[SwitchAgent], tracker: IncidentTracker | None = None,
                 mitigator: "Mitigator | None" = None) -> None:
        self.agents = agents
        self.tracker = tracker
        self.mitigator = mitigator

    def collect(self) -> Iterable:
        pulses = CounterMetricFamily("flowpulse_pulses", "Pulses (collective iterations) judged", labels=["switch"])
        warming = GaugeMetricFamily("flowpulse_agent_learning", "1 while the detector learns its healthy pulse",
                                    labels=["switch"])
        pkts = GaugeMetricFamily("flowpulse_port_pulse_packets", "IPv4 packets on the port in the last pulse",
                                 labels=["switch", "port", "ifname", "direction"])
        score = GaugeMetricFamily("flowpulse_port_deviation_score",
                                  "Largest CUSUM evidence of the port as a fraction of its threshold (alarm at 1)",
                                  labels=["switch", "port", "ifname"])
        thresh = GaugeMetricFamily("flowpulse_score_threshold", "Score that raises an alert (always 1)",
                                   labels=["switch"])
        noise = GaugeMetricFamily("flowpulse_noise_factor",
                                  "Learned noise factor of a check (variance / its spray-mode form)",
                                  labels=["switch", "check"])
        active = GaugeMetricFamily("flowpulse_alert_active", "1 while an alert is active",
                                   labels=["switch", "port", "ifname", "link", "kind"])
        rate = GaugeMetricFamily("flowpulse_alert_estimated_rate", "Estimated loss/corruption rate of an active alert",
                                 labels=["switch", "port", "ifname", "link", "kind"])
        alerts = CounterMetricFamily("flowpulse_alerts", "Alerts raised", labels=["switch", "kind"])
        resync = CounterMetricFamily("flowpulse_reader_resyncs", "Counter resets / reloads survived", labels=["switch"])
        lost = CounterMetricFamily("flowpulse_pulses_lost", "Pulses the kernel's ring overwrote before the agent "
                                   "read them (the agent fell a whole ring behind)", labels=["switch"])
        busy = CounterMetricFamily("flowpulse_agent_busy_seconds", "CPU-side time spent polling and judging",
                                   labels=["switch"])
        skipped = CounterMetricFamily("flowpulse_pulses_skipped", "Pulses not judged because they began before "
                                      "counting ran on every port (an agent started during a burst)",
                                      labels=["switch"])
        errors = CounterMetricFamily("flowpulse_agent_errors", "Polls that raised (logged with their traceback; the "
                                     "agent goes on, and exits after many in a row)", labels=["switch"])
        pulse_age = GaugeMetricFamily("flowpulse_last_pulse_age_seconds", "Seconds since the switch's latest pulse was "
                                      "read (since the agent started, before its first)", labels=["switch"])
        poll_age = GaugeMetricFamily("flowpulse_last_poll_age_seconds", "Seconds since the poll loop last looked at "
                                     "the switch's counters (at least once a second: more means stuck)",
                                     labels=["switch"])
        now = time.monotonic()
        for a in self.agents:
            with a.lock:      # one pulse's state: the poll loop steps the detector under it
                self._agent(a, pulses, warming, thresh, noise, resync, busy, alerts, pkts, score, active, rate)
                lost.add_metric([a.switch], a.reader.lost)
                errors.add_metric([a.switch], a.errors)
                skipped.add_metric([a.switch], getattr(a.reader, "skipped", 0))
                pulse_age.add_metric([a.switch], now - (a.last_pulse_at or a.started_at))
                poll_age.add_metric([a.switch], now - a.last_poll)
        yield from (pulses, warming, pkts, score, thresh, noise, active, rate, alerts, resync, lost, busy, errors,
                    skipped, pulse_age, poll_age)
        bad = CounterMetricFamily("flowpulse_bad_input", "Files and records refused as bad content (verdict files of "
                                  "other agents, saved state), one log line each time one turns bad",
                                  labels=["source"])
        refused = REFUSED.snapshot()
        for source in BAD_INPUT_SOURCES:
            bad.add_metric([source], refused.get(source, 0))
        yield bad
        yield InfoMetricFamily("flowpulse_build", "The agent's version", value={"version": version()})
        if self.tracker is not None:
            with self.tracker.lock:
                fams = self._incidents()
            yield from fams
        if self.mitigator is not None:
            with self.mitigator.lock:
                yield from self._mitigation(self.mitigator)

    @staticmethod
    def _mitigation(m) -> list:
        acts = CounterMetricFamily("flowpulse_mitigation_actions", "Mitigation actions taken (agent --mitigate)",
                                   labels=["action"])
        for action in ("drain", "canary", "canary_lifted", "refused"):
            acts.add_metric([action], m.actions[action])
        drained = GaugeMetricFamily("flowpulse_link_drained", "1 per link the mitigation drained (until an operator "
                                    "restores it)", labels=["link", "incident"])
        for link, iid in sorted(m.drained().items()):
            drained.add_metric([link, iid], 1)
        canary = GaugeMetricFamily("flowpulse_link_canary_weight", "Weight of an uplink held at a canary share while "
                                   "its incident is localizing", labels=["link", "incident"])
        for link, (iid, weight) in sorted(m.canary_weights().items()):
            canary.add_metric([link, iid], weight)
        return [acts, drained, canary]

    def _agent(self, a, pulses, warming, thresh, noise, resync, busy, alerts, pkts, score, active, rate) -> None:
        sw = a.switch
        det = a.detector
        pulses.add_metric([sw], a.pulses)
        warming.add_metric([sw], 1.0 if det.warming_up else 0.0)
        thresh.add_metric([sw], 1.0)
        for check, phi in det.noise_factors().items():
            noise.add_metric([sw, check], phi)
        resync.add_metric([sw], a.reader.resyncs)
        busy.add_metric([sw], a.busy_s)
        for kind in (AlertKind.LOSS, AlertKind.CORRUPTION):
            alerts.add_metric([sw, kind], a.alerts_total.get(kind, 0))
        if a.last_pulse is not None:
            for p in a.dep.fabric.ports[sw]:
                for d, dn in ((0, "in"), (1, "out")):
                    pkts.add_metric([sw, str(p.index), p.ifname, dn], float(a.last_pulse.ip[p.index, d].sum()))
        scores = det.port_scores()
        for p in a.dep.fabric.ports[sw]:
            score.add_metric([sw, str(p.index), p.ifname], scores.get(p.index, 0.0))
        for oa in list(det.active.values()):
            al = oa.alert
            labels = [sw, str(al.port), al.ifname, al.link or "|".join(al.candidates), al.kind]
            active.add_metric(labels, 1.0)
            rate.add_metric(labels, al.estimated_rate)

    def _incidents(self) -> list:
        inc = GaugeMetricFamily("flowpulse_incident",
                                "1 per open incident: link is the one named, or the candidates joined by | while "
                                "localizing; candidates: the links its first alerts pointed at; domain: the node "
                                "all of them go through (one fault's incidents share it)",
                                labels=["incident", "link", "candidates", "kind", "state", "domain"])
        irate = GaugeMetricFamily("flowpulse_incident_estimated_rate", "Estimated rate of an open incident",
                                  labels=["incident", "link", "candidates", "kind", "state", "domain"])
        for i in list(self.tracker.incidents.values()):
            cands = "|".join(sorted({c for a in i.alerts.values() for c in a.candidates or []}))
            labels = [i.incident_id, i.link or "|".join(i.candidates), cands, i.kind, i.state, i.domain]
            inc.add_metric(labels, 1.0)
            irate.add_metric(labels, i.rate)
        return [inc, irate, *self._costs()]

    def _costs(self) -> list:
        """What each open incident has cost so far (agent.faultcost): seconds from its onset to its first
        alert, its name and its drain; the pulse period and resent segments before, during and after."""
        secs = GaugeMetricFamily("flowpulse_incident_seconds", "Seconds from an open incident's estimated onset to "
                                 "its first alert (to=detect), the link named (name) and the drain (drain)",
                                 labels=["incident", "to"])
        period = GaugeMetricFamily("flowpulse_incident_pulse_period_seconds", "Median seconds between pulse starts "
                                   "(one collective iteration) at the switch that first alerted, before the "
                                   "incident's onset, during the fault and after the drain", labels=["incident",
                                                                                                     "switch", "phase"])
        resent = GaugeMetricFamily("flowpulse_incident_resent_segments", "Median TCP segments per pulse that came in "
                                   "again at that switch, in the same phases", labels=["incident", "switch", "phase"])
        actions = list(self.mitigator.history) if self.mitigator is not None else []
        costs = incident_costs(list(self.tracker.incidents.values()), self.tracker.history, actions,
                               {a.switch: a.pulse_log for a in self.agents}, time.time())
        for iid, c in sorted(costs.items()):
            for to, v in c["seconds"].items():
                if v is not None:
                    secs.add_metric([iid, to], v)
            for phase, m in c["phases"].items():
                if m["period_s"] is not None:
                    period.add_metric([iid, c["switch"], phase], m["period_s"])
                if m["resent"] is not None:
                    resent.add_metric([iid, c["switch"], phase], m["resent"])
        return [secs, period, resent]


STALL_S = 5.0  # a poll loop silent this long is stuck (it looks at least once a second, run_agents)


def health(agents: list[SwitchAgent], now: float | None = None) -> tuple[bool, dict]:
    """The agents' liveness: each switch's poll loop ran in the last STALL_S seconds.
    A switch without traffic is healthy (no pulses is not a fault of the agent)."""
    now = time.monotonic() if now is None else now
    sw = {a.switch: {"pulses": a.pulses, "last_poll_age_s": round(now - a.last_poll, 3),
                     "open_alerts": len(a.detector.active), "resyncs": a.reader.resyncs,
                     "pulses_lost": a.reader.lost} for a in agents}
    ok = all(v["last_poll_age_s"] < STALL_S for v in sw.values())
    return ok, {"status": "ok" if ok else "stalled", "switches": sw}


MAX_CONNECTIONS = 16      # requests served at once; more are closed at once (a scraper needs one)
CONNECTION_TIMEOUT_S = 10.0   # a connection silent this long (a slow or stuck client) is closed


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """A thread per request, at most MAX_CONNECTIONS at once; with TLS, the handshake happens in the
    request's thread under its timeout, never in the accepting one."""

    daemon_threads = True
    ssl_context: "ssl.SSLContext | None" = None

    def server_bind(self) -> None:
        super().server_bind()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def get_request(self):
        sock, addr = super().get_request()
        sock.settimeout(CONNECTION_TIMEOUT_S)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)          # full: this one is dropped, the ones served go on
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            if self.ssl_context is not None:
                try:
                    request.do_handshake()
                except (OSError, ssl.SSLError):
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # scrapes every second would flood stderr
        pass


def serve(agents: list[SwitchAgent], port: int, addr: str = "127.0.0.1",
          tracker: IncidentTracker | None = None, mitigator: "Mitigator | None" = None,
          web: "WebConfig | None" = None) -> CollectorRegistry:
    """Start the HTTP endpoint (loopback by default: agents' data is not for the world):
    ``/metrics`` (Prometheus), ``/healthz`` (200 with JSON while every poll loop runs, else 503) and
    ``/verdicts/<switch>`` (the switch's latest verdict document, for the other agents);
    with ``web`` (agent.webconfig), over TLS and/or behind basic authentication."""
    from prometheus_client import ProcessCollector, make_wsgi_app

    reg = CollectorRegistry()
    reg.register(AgentCollector(agents, tracker, mitigator))
    ProcessCollector(registry=reg)            # process_cpu_seconds_total, process_resident_memory_bytes, ...
    metrics_app = make_wsgi_app(reg)

    def app(environ, start_response):
        if web is not None and not web.authorized(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="flowpulse"'),
                                                ("Content-Type", "text/plain")])
            return [b"Unauthorized\n"]
        path = environ.get("PATH_INFO", "")
        if path.startswith("/verdicts/"):          # the owners' evidence, for peers (agent/verdictpeers.py)
            doc = next((a.verdict_doc for a in agents if path == f"/verdicts/{a.switch}"), None)
            if doc is None:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"no verdicts\n"]
            start_response("200 OK", [("Content-Type", "application/json")])
            return [doc.encode()]
        if environ.get("PATH_INFO") == "/healthz":
            ok, body = health(agents)
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        return metrics_app(environ, start_response)

    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("FlowPulseHTTP", (_ThreadingWSGIServer,), {
        "address_family": family, "ssl_context": web.ssl_context() if web is not None and web.tls else None})
    server = make_server(addr, port, app, server_class, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="flowpulse-http").start()
    return reg
