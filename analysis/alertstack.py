"""The shipped Prometheus and Alertmanager configurations, run against live agents (tests and benches).

:class:`AlertStack` starts Debian's ``prometheus`` and ``prometheus-alertmanager`` from
``deploy/prometheus/prometheus.yml``, ``deploy/prometheus/flowpulse.rules.yml`` and
``deploy/alertmanager/alertmanager.yml``, changing only what a run on loopback must: the addresses,
the paths, the scrape and evaluation interval (1 s), and, when asked, Alertmanager's ``group_wait`` and
``group_interval`` (shortened, they give a fault more chances to page twice, not fewer). Every
receiver's webhook points at one :class:`Webhook` on loopback, which keeps each notification with the
time it came.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent (``notifications``) and the
    time each came (``times``, the same order)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got = self.notifications = []
        times = self.times = []
        lock = self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    got.append(body)
                    times.append(time.time())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/flowpulse"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def since(self, t: float) -> list[dict]:
        """The notifications that came at or after ``t``."""
        return [n for n, _ in self.since_with_times(t)]

    def since_with_times(self, t: float) -> list[tuple[dict, float]]:
        """The notifications that came at or after ``t``, each with the time it came."""
        with self.lock:
            return [(n, at) for n, at in zip(self.notifications, self.times) if at >= t]

    def last_time(self) -> float | None:
        with self.lock:
            return self.times[-1] if self.times else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _die_with_parent() -> None:
    """Prometheus and Alertmanager go with the process that started them, even on SIGKILL."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class AlertStack:
    """Prometheus on ``base``, Alertmanager on ``base + 1``, scraping ``metrics_ports`` on loopback;
    their configurations, data and logs in ``workdir``. ``close`` stops both."""

    def __init__(self, workdir: Path, metrics_ports: list[int], base: int, hook: Webhook,
                 group_wait: str | None = None, group_interval: str | None = None) -> None:
        import yaml

        if not (PROMETHEUS and ALERTMANAGER):
            raise RuntimeError("prometheus or alertmanager missing: scripts/setup.sh installs Debian's "
                               "prometheus and prometheus-alertmanager packages")
        self.workdir, self.base = workdir, base
        rules = workdir / "flowpulse.rules.yml"
        shutil.copy(DEPLOY / "prometheus" / "flowpulse.rules.yml", rules)
        prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        prom["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        prom["rule_files"] = [str(rules)]
        prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{base + 1}"]
        (workdir / "targets").mkdir(exist_ok=True)
        (workdir / "targets" / "agents.json").write_text(
            json.dumps([{"targets": [f"127.0.0.1:{p}" for p in metrics_ports]}]))
        prom["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(workdir / "targets" / "*.json")]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(prom))
        am = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
        if group_wait:
            am["route"]["group_wait"] = group_wait
        if group_interval:
            am["route"]["group_interval"] = group_interval
        for rcv in am["receivers"]:
            for wh in rcv.get("webhook_configs", []):
                wh["url"] = hook.url
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(am))
        self.procs: list[subprocess.Popen] = []
        try:
            with open(workdir / "prometheus.log", "w") as log:
                self.procs.append(subprocess.Popen(
                    [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{base}"], stdout=subprocess.DEVNULL, stderr=log,
                    preexec_fn=_die_with_parent))
            with open(workdir / "alertmanager.log", "w") as log:
                self.procs.append(subprocess.Popen(
                    [ALERTMANAGER, f"--config.file={workdir / 'alertmanager.yml'}", f"--storage.path={workdir / 'am'}",
                     f"--web.listen-address=127.0.0.1:{base + 1}", "--cluster.listen-address="],
                    stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_die_with_parent))
        except BaseException:
            self.close()
            raise

    def alerts(self) -> list[dict]:
        """Prometheus's active alerts (its HTTP API)."""
        import urllib.request

        body = urllib.request.urlopen(f"http://127.0.0.1:{self.base}/api/v1/alerts", timeout=5).read()
        return json.loads(body)["data"]["alerts"]

    def query(self, expr: str) -> list[dict]:
        """An instant PromQL query's result (Prometheus's HTTP API)."""
        import urllib.parse
        import urllib.request

        url = f"http://127.0.0.1:{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]

    def log_tail(self, n: int = 1000) -> str:
        return (self.workdir / "prometheus.log").read_text()[-n:]

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
