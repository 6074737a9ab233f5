"""The FlowPulse detector of one switch: expected pulse, deviation test, alerts.

It uses only this switch's per-pulse counts plus static configuration (the
fabric model, spray weights, links known to be out of service or degraded).

Tests ("cells"), each giving per pulse a deficit ``r = expected - observed`` and
its null variance ``V``:

* **leaf peer test** (per source leaf s, ingress uplinks). Spraying splits the
  packets from s to this leaf over the uplinks in known shares ``w_k`` (analytic:
  from the fabric model; learned: measured in healthy pulses). With ``N`` the
  packets from s on all uplinks of the group, ``E_k = w_k N``. Because it is
  normalised by the pulse's own total, it needs no traffic matrix and survives
  changes of the workload. Null variance: multinomial ``N w (1-w)`` for random
  spraying; for round-robin the split is near exact and V is learned from the
  warm-up pulses (floor ``min_var``). A loss rate p on port k gives
  ``r_k = p w_k (1 - w_k) N`` (retransmissions are re-sprayed over all ports).
* **spine baseline test** (per ingress port and source). A spine sees only one
  uplink of each leaf, so it compares each port with its own healthy pulses
  (median), scaled by the median ratio over its ports so that a workload that
  grows or shrinks everywhere is not a fault. V is learned (MAD) with a floor.
* **corruption test**: frames with a broken IPv4 header arriving on a port are
  counted separately; any consistent count is corruption on the incoming link.

Sequential accumulation: for windows of 1, 2, 4, ... ``max_window`` pulses the
detector sums r and V and computes ``z = sum r / sqrt(sum V)``. An alarm needs
``z > z*`` with ``z* = Phi^-1(1 - alpha / (cells x windows))`` (Bonferroni), so
the probability of any false alarm on this switch in one pulse is <= ``alpha``
if the null model holds. Short windows catch big losses in one pulse; long
ones accumulate the evidence of small losses (sensitivity grows as sqrt(w)).
"""
from __future__ import annotations

import math
from collections import deque
from functools import lru_cache
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.special import chdtri, ndtri  # exact quantiles; scipy.stats would add ~45 MiB per agent

from agent.pulse import PulseCounts
from netns_testbed.topo import Fabric, Link, node_kind, node_num


@lru_cache(maxsize=4096)
def _chi2_lower(q: float, dof: float) -> float:
    """Lower q-quantile of chi-square with ``dof`` degrees of freedom."""
    return float(chdtri(dof, 1.0 - q))


def pulses_needed(deficit: float, var: float, z_star: float, z_power: float = 1.2816) -> int:
    """Pulses of evidence a deficit needs to be caught with 90% power (default).

    With a per-pulse deficit ``deficit`` (packets, ~ p w (1-w) N for loss rate p)
    and null variance ``var`` per pulse, k pulses give z = k d / sqrt(k V), so
    ``k >= (z* + z_power)^2 V / d^2``. The multi-window test looks at windows that
    are powers of two, so detection comes at the first window >= k.
    """
    return max(1, math.ceil((z_star + z_power) ** 2 * var / (deficit * deficit)))


@dataclass
class DetectorConfig:
    """Parameters of the test; see the module docstring for their meaning."""

    model: str = "analytic"        # analytic | learned: where the expected shares come from
    spray: str = "rrdst"           # random | rr | rrdst: the null variance of the peer test
    alpha: float = 1e-6            # false-alarm probability per switch per pulse
    max_window: int = 256          # longest accumulation window, pulses (powers of two up to it)
    warmup: int = 12               # healthy pulses to learn variances (and shares/baselines)
    min_pulse_pkts: int = 200      # smaller pulses are background noise (pings, ARP): ignored
    min_cell_pkts: int = 20        # a source must have sent this many packets for its test
    min_var: float = 1.0           # floor of the null variance, packets^2
    var_inflation: float = 1.0     # extra factor on learned variances (on top of their 99% upper bound)
    var_confidence: float = 0.01   # learned variance = its (1 - this) upper confidence bound (chi-square)
    min_rate: float = 0.001        # ignore deficits below this loss rate (model error, not faults)
    clear_after: int = 8           # pulses without evidence before an alert is resolved
    clear_fraction: float = 0.5    # hysteresis: a pulse is quiet only if the best z < this x z*
    spine_tests: bool = True
    spine_min_sd_frac: float = 0.008  # spine baseline sd floor, as a fraction of the expected count
    corruption_min: int = 2        # damaged frames in a window that make a corruption alert
    resolve_lr: float = 100.0      # likelihood ratio that settles which of two candidate links it is

    def windows(self) -> list[int]:
        out, w = [], 1
        while w <= self.max_window:
            out.append(w)
            w *= 2
        return out

    def validate(self) -> "DetectorConfig":
        from flowpulse.errors import SpecError

        if self.model not in ("analytic", "learned"):
            raise SpecError(f"bad model {self.model!r}: analytic or learned")
        if self.spray not in ("random", "rr", "rrdst"):
            raise SpecError(f"bad spray {self.spray!r}: random, rr or rrdst")
        if not 0 < self.alpha < 0.5:
            raise SpecError(f"bad alpha {self.alpha}: must be in (0, 0.5)")
        if self.max_window < 1 or self.warmup < 2:
            raise SpecError("max_window must be >= 1 and warmup >= 2")
        return self


@dataclass
class Cell:
    """One test: a port (and source) whose deficit is tracked over pulses."""

    key: tuple
    port: int
    direction: str
    src: int
    kind: str                                  # peer | baseline | corruption
    r: deque = field(default_factory=deque)
    v: deque = field(default_factory=deque)
    e: deque = field(default_factory=deque)    # expected counts (rate estimate)
    o: deque = field(default_factory=deque)    # observed
    scale: deque = field(default_factory=deque)  # p -> r factor per pulse
    t0: deque = field(default_factory=deque)   # pulse start times (wall)
    warm: list = field(default_factory=list)   # warm-up samples
    learned: dict = field(default_factory=dict)


@dataclass
class Alert:
    """An alert as written to alerts.jsonl and report.json."""

    event: str
    alert_id: str
    time: float
    switch: str
    port: int
    ifname: str
    direction: str
    link: str | None
    candidates: list[str]
    kind: str
    estimated_rate: float
    rate_ci: list[float]
    score: float
    window: int
    pulse: int
    pulse_start: float
    evidence: dict

    def to_dict(self) -> dict:
        return asdict(self)


class SwitchDetector:
    """Detector of one switch. Feed it :class:`PulseCounts`; it returns alert events."""

    def __init__(self, fabric: Fabric, switch: str, cfg: DetectorConfig | None = None,
                 weights: dict[str, float] | None = None, out_of_service: list[Link] | None = None,
                 degraded: list[Link] | None = None) -> None:
        self.fabric = fabric
        self.switch = switch
        self.cfg = (cfg or DetectorConfig()).validate()
        self.weights = dict(weights or {})
        self.oos = list(out_of_service or [])
        self.degraded = {l.name for l in degraded or []}
        self.is_leaf = node_kind(switch) == "leaf"
        self.windows = self.cfg.windows()
        self.cells: dict[tuple, Cell] = {}
        self.pulses_seen = 0
        self.pulses_used = 0
        self.active: dict[str, dict] = {}      # alert_id -> state
        self.last_scores: dict[tuple, float] = {}
        self.nports = len(fabric.ports[switch])
        self.significant = False               # any cell significant in the last pulse (FA accounting)
        self.groups: dict[int, list[float]] = {}  # source -> [sum r^2 / n, samples, dof] of healthy pulses
        self._share_cache: dict[str, dict[str, float]] = {}
        self._z_cache: tuple[int | None, float] = (None, 0.0)
        self._spine_scale = 1.0                # this pulse's workload scale at a spine (median ratio)

    def _shares(self, s_leaf: str) -> dict[str, float]:
        """Expected spray shares of traffic from ``s_leaf`` to this leaf (cached per known state)."""
        if s_leaf not in self._share_cache:
            self._share_cache[s_leaf] = self.fabric.spray_shares(s_leaf, self.switch, self.weights, self.oos)
        return self._share_cache[s_leaf]

    # -- thresholds -----------------------------------------------------------
    def z_star(self) -> float:
        """Bonferroni threshold over this switch's cells and windows (cached: quantiles are slow)."""
        ncells = max(1, len(self.cells))
        if self._z_cache[0] != ncells:
            self._z_cache = (ncells, float(-ndtri(self.cfg.alpha / (ncells * len(self.windows)))))
        return self._z_cache[1]

    # -- the per-pulse step ------------------------------------------------------
    def observe(self, pc: PulseCounts) -> list[Alert]:
        self.pulses_seen += 1
        self.significant = False
        if pc.nports != self.nports:
            raise ValueError(f"{self.switch}: pulse has {pc.nports} ports, the fabric model {self.nports}")
        if pc.total < self.cfg.min_pulse_pkts:
            return []
        self.pulses_used += 1
        samples = self._samples(pc)
        events: list[Alert] = []
        touched: dict[str, tuple] = {}
        sustained: set[str] = set()            # active alerts still well above the noise
        ready = False
        for key, (port, direction, src, kind, obs, scale, extra) in samples.items():
            cell = self.cells.get(key)
            if cell is None:
                cell = self.cells[key] = Cell(key, port, direction, src, kind)
            if not cell.learned:
                # warm-up (or a cell that appeared later): learn from its first pulses
                cell.warm.append((obs, extra))
                ready = ready or len(cell.warm) >= self.cfg.warmup
                continue
            r, v, e = self._residual(cell, obs, extra)
            if kind == "peer":
                self._refine(cell, r, extra["n"])
            for dq, x in ((cell.r, r), (cell.v, v), (cell.e, e), (cell.o, obs), (cell.scale, scale),
                          (cell.t0, pc.start_time)):
                dq.append(x)
                if len(dq) > self.cfg.max_window:
                    dq.popleft()
            best_z, hit = self._scan(cell)
            self.last_scores[key] = hit[0] if hit else best_z
            aid = f"{self.switch}/{port}/{direction}/{'corruption' if kind == 'corruption' else 'loss'}"
            if hit:
                prev = touched.get(aid)
                if prev is None or hit[0] > prev[1][0]:
                    touched[aid] = (cell, hit)
            elif aid in self.active and (kind == "corruption" and cell.r and cell.r[-1] > 0
                                         or self.last_scores[key] >= self.cfg.clear_fraction * self.z_star()):
                sustained.add(aid)
        if ready:
            self._learn_ready()
        self.significant = bool(touched)
        events += self._alerts(pc, touched, sustained)
        return events

    # -- samples per pulse ---------------------------------------------------------
    def _samples(self, pc: PulseCounts) -> dict:
        """key -> (port, dir, src, kind, observed, p->r scale, extra)."""
        out: dict = {}
        ip = pc.ip
        cfg = self.cfg
        # corruption: damaged frames received on each port
        for p in range(self.nports):
            out[("bad", p)] = (p, "in", -1, "corruption", float(pc.bad[p, 0]), 1.0, float(ip[p, 0].sum()))
        if self.is_leaf:
            S = self.fabric.spec.spines
            me = self.switch
            for s_leaf in self.fabric.leaves:
                if s_leaf == me:
                    continue
                src = node_num(s_leaf) + 1
                if ip[:S, 0, src].sum() < cfg.min_cell_pkts:
                    continue
                shares = self._shares(s_leaf)
                group = [k for k in range(S) if f"spine{k}" in shares
                         and f"spine{k}->{me}" not in self.degraded and f"{s_leaf}->spine{k}" not in self.degraded]
                if len(group) < 2:
                    continue
                wsum = sum(shares[f"spine{k}"] for k in group)
                c = np.array([float(ip[k, 0, src]) for k in group])
                n = c.sum()
                if n < cfg.min_cell_pkts:
                    continue
                for i, k in enumerate(group):
                    w = shares[f"spine{k}"] / wsum
                    out[("peer", k, src)] = (k, "in", src, "peer", c[i], w * (1 - w) * n, {"w": w, "n": n})
        elif cfg.spine_tests:
            for p in range(self.nports):
                for src in np.flatnonzero(ip[p, 0] >= cfg.min_cell_pkts).tolist():
                    out[("base", p, src)] = (p, "in", src, "baseline", float(ip[p, 0, src]), None, None)
            for key in self.cells:  # a port that fell silent is the strongest evidence of all
                if key[0] == "base" and key not in out:
                    out[key] = (key[1], "in", key[2], "baseline", float(ip[key[1], 0, key[2]]), None, None)
            # common scale: median over ports of observed / baseline (workload size changes)
            ratios = []
            for key, sample in out.items():
                cell = self.cells.get(key)
                if key[0] == "base" and cell is not None and cell.learned.get("mu", 0) >= cfg.min_cell_pkts:
                    ratios.append(sample[4] / cell.learned["mu"])
            self._spine_scale = float(np.median(ratios)) if ratios else 1.0
        return out

    def _learn_ready(self) -> None:
        """Learn every cell whose warm-up is complete.

        Peer cells of one source group are exchangeable under the null (same
        spray rotation), so their variance is pooled over the group's ports:
        4 ports x 12 pulses give a far steadier estimate than 12 samples each.
        """
        cfg = self.cfg
        ready = [c for c in self.cells.values() if not c.learned and len(c.warm) >= cfg.warmup]
        groups: dict[int, list[Cell]] = {}
        for cell in ready:
            if cell.kind == "peer":
                groups.setdefault(cell.src, []).append(cell)
            elif cell.kind == "baseline":
                obs = np.array([w[0] for w in cell.warm])
                mu = float(np.median(obs))
                mad = float(np.median(np.abs(obs - mu))) * 1.4826
                cell.learned = {"mu": mu, "sd": max(mad, float(np.std(obs)))}
                cell.warm = []
            else:
                cell.learned = {"ok": True}
                cell.warm = []
        for src, cells in groups.items():
            stats = []
            for cell in cells:
                obs = np.array([w[0] for w in cell.warm])
                ns = np.array([w[1]["n"] for w in cell.warm])
                w_model = float(np.mean([w[1]["w"] for w in cell.warm]))
                share = obs.sum() / max(ns.sum(), 1.0) if cfg.model == "learned" else w_model
                resid = share * ns - obs
                stats.append((cell, share, resid, ns))
            ssn = sum(float(np.sum(r ** 2 / np.maximum(ns, 1.0))) for _, _, r, ns in stats)
            # k ports whose residuals sum to zero carry k-1 degrees of freedom per pulse
            k = len(stats)
            samples = sum(len(r) for _, _, r, _ in stats)
            dof = samples * (k - 1) / k - (k if cfg.model == "learned" else 0)
            self.groups[src] = [ssn, float(samples), max(dof, 1.0)]
            vpp = ssn / samples
            for cell, share, resid, ns in stats:
                # a learned share w = sum(obs) / sum(n) has Var = vpp / sum(n); that error adds
                # coherently over a window (see _window_sums)
                share_var = vpp / max(float(ns.sum()), 1.0) if cfg.model == "learned" else 0.0
                cell.learned = {"share": share, "share_var": share_var}
                cell.warm = []

    def _residual(self, cell: Cell, obs: float, extra) -> tuple[float, float, float]:
        cfg = self.cfg
        if cell.kind == "peer":
            n, w_model = extra["n"], extra["w"]
            w = cell.learned["share"] if cfg.model == "learned" else w_model
            e = w * n
            v_multi = n * w * (1 - w)
            v_learn = self._var_per_pkt(cell.src) * n * cfg.var_inflation
            v = v_multi if cfg.spray == "random" else max(cfg.min_var, v_learn)
            if cfg.spray == "random":
                v = max(v, v_learn)
            return e - obs, v, e
        if cell.kind == "baseline":
            mu = cell.learned["mu"] * self._spine_scale
            if cell.learned["mu"] < cfg.min_cell_pkts:
                return 0.0, 1.0, mu
            # learned spread at its upper confidence bound (few warm-up samples), never below
            # the floor; with random spraying a spine's share of a leaf's packets is itself
            # binomial: var >= mu (1 - 1/S)
            dof = max(cfg.warmup - 1, 1)
            var = cell.learned["sd"] ** 2 * cfg.var_inflation * dof / _chi2_lower(cfg.var_confidence, float(dof))
            var = max(var, (cfg.spine_min_sd_frac * mu) ** 2, 1.0)
            if cfg.spray == "random":
                var = max(var, mu * (1 - 1 / self.fabric.spec.spines))
            return mu - obs, var, mu
        # corruption: r = damaged frames, e = good frames on the port
        return obs, 1.0, extra

    def _var_per_pkt(self, src: int) -> float:
        """Upper (1 - var_confidence) bound of the pooled residual variance per packet of a source group."""
        ssn, samples, dof = self.groups.get(src, (0.0, 1.0, 1.0))
        return (ssn / samples) * dof / _chi2_lower(self.cfg.var_confidence, round(dof, 1))

    def _refine(self, cell: Cell, r: float, n: float) -> None:
        """Keep learning the noise from healthy pulses (|z| < 3, no alert on this switch)."""
        if self.active or cell.kind != "peer" or cell.src not in self.groups:
            return
        v = max(self.cfg.min_var, self._var_per_pkt(cell.src) * n)
        if r * r < 9 * v:
            g = self.groups[cell.src]
            k = sum(1 for c in self.cells.values() if c.kind == "peer" and c.src == cell.src)
            g[0] += r * r / max(n, 1.0)
            g[1] += 1.0
            g[2] += (k - 1) / max(k, 1)

    def _window_sums(self, cell: Cell) -> list[tuple[int, float, float, float]]:
        """(w, sum of r, null variance, p->r factor) for each window the cell has filled, newest back.

        Per-pulse noise adds up (sum of V); the error of a learned share does not
        average out but grows with the packets in the window: + var(share) (sum n)^2.
        The p->r factor is the sum of the peer scales (or of the expected counts).
        """
        share_var = cell.learned.get("share_var", 0.0) if cell.kind == "peer" else 0.0
        use_scale = cell.kind == "peer"
        out: list[tuple[int, float, float, float]] = []
        sr = sv = se = ssc = 0.0
        wi, windows = 0, self.windows
        for i, (r, v, e, sc) in enumerate(zip(reversed(cell.r), reversed(cell.v), reversed(cell.e),
                                              reversed(cell.scale)), 1):
            sr, sv, se = sr + r, sv + v, se + e
            if use_scale:
                ssc += sc
            if i == windows[wi]:
                var = sv
                if share_var:
                    n_sum = se / max(cell.learned["share"], 1e-9)
                    var += share_var * n_sum * n_sum
                out.append((i, sr, var, ssc if use_scale else se))
                wi += 1
                if wi == len(windows):
                    break
        return out

    def _scan(self, cell: Cell) -> tuple[float, tuple[float, int, float, float, float] | None]:
        """(largest z over the windows, best significant window or None).

        The window: (z, window, rate, rate_sd, deficit); for damaged frames z is their count.
        """
        cfg = self.cfg
        sums = self._window_sums(cell)
        best_z = max([0.0] + [sr / math.sqrt(var) for _, sr, var, _ in sums if var > 0])
        if cell.kind == "corruption":
            r = list(cell.r)
            for w, bad, _, good in sums:
                if bad >= cfg.corruption_min and sum(1 for x in r[-w:] if x > 0) >= min(w, 2):
                    rate = bad / max(bad + good, 1.0)
                    return best_z, (float(bad), w, rate, math.sqrt(bad) / max(bad + good, 1.0), bad)
            return best_z, None
        zs = self.z_star()
        best = None
        for w, sr, var, denom in sums:
            if var <= 0:
                continue
            z = sr / math.sqrt(var)
            if z <= zs:
                continue
            rate = sr / denom if denom > 0 else 0.0
            if rate < cfg.min_rate:
                continue
            if best is None or z > best[0]:
                best = (z, w, rate, math.sqrt(var) / denom if denom > 0 else 0.0, sr)
        return best_z, best

    # -- localisation and alert state ----------------------------------------------
    def _candidates(self, cell: Cell) -> tuple[str | None, list[str]]:
        port = self.fabric.port(self.switch, cell.port)
        incoming = f"{port.peer}->{self.switch}"
        if cell.kind in ("corruption", "baseline") or not self.is_leaf:
            return incoming, [incoming]
        # a leaf's deficit on uplink k for source leaf s: either spine k -> this
        # leaf, or leaf s -> spine k (the packets never reached the spine)
        upstream = f"leaf{cell.src - 1}->{port.peer}"
        return None, [incoming, upstream]

    def _resolve(self, cell: Cell, rate: float) -> str | None:
        """Tell the two candidate links apart with the *other* sources through the same port.

        If the spine->leaf link is lossy, every source's packets through it show a
        deficit at rate p; if the leaf->spine link of the source is, the others show
        none. A sequential likelihood ratio over the other sources' cells decides
        once it passes ``resolve_lr`` either way (it needs traffic from >1 source).
        """
        llr = 0.0
        informative = False
        for key, other in self.cells.items():
            if other.kind != "peer" or other.port != cell.port or other.src == cell.src or not other.r:
                continue
            for r, v, s in zip(other.r, other.v, other.scale):
                mu1 = rate * s  # deficit if the spine->leaf link is the culprit
                llr += (r * mu1 - mu1 * mu1 / 2) / v
                informative = informative or mu1 * mu1 / v > 0.01
        if not informative:
            return None
        port = self.fabric.port(self.switch, cell.port)
        if llr > math.log(self.cfg.resolve_lr):
            return f"{port.peer}->{self.switch}"
        if llr < -math.log(self.cfg.resolve_lr):
            return f"leaf{cell.src - 1}->{port.peer}"
        return None

    def _alerts(self, pc: PulseCounts, touched: dict[str, tuple], sustained: set[str]) -> list[Alert]:
        events: list[Alert] = []
        for aid, (cell, (z, w, rate, rate_sd, deficit)) in touched.items():
            link, cands = self._candidates(cell)
            if link is None:
                link = self._resolve(cell, rate)
            state = self.active.get(aid)
            ev = "alert" if state is None else "update"
            if state is not None and state.get("link") and link is None:
                link = state["link"]
            port = self.fabric.port(self.switch, cell.port)
            lo, hi = max(0.0, rate - 1.96 * rate_sd), min(1.0, rate + 1.96 * rate_sd)
            kind = "corruption" if cell.kind == "corruption" else "loss"
            alert = Alert(ev, aid, pc.end_time, self.switch, cell.port, port.ifname, cell.direction, link, cands,
                          kind, round(rate, 6), [round(lo, 6), round(hi, 6)], round(z, 3), w, pc.pulse,
                          pc.start_time,
                          {"expected": round(sum(list(cell.e)[-w:]), 1), "observed": round(sum(list(cell.o)[-w:]), 1),
                           "deficit": round(deficit, 1), "source": (f"leaf{cell.src - 1}" if cell.src > 0 else None),
                           "test": cell.kind, "z_threshold": round(self.z_star(), 3),
                           "window_start": list(cell.t0)[-w] if len(cell.t0) >= w else pc.start_time})
            if state is None or state.get("link") != link or abs(state.get("rate", 0) - rate) > max(0.2 * rate, 0.001) \
                    or pc.pulse - state.get("last_event_pulse", 0) >= 16:
                events.append(alert)
                state = {**(state or {}), "link": link, "rate": rate, "last_event_pulse": pc.pulse}
            state = state or {}
            state["quiet"] = 0
            state["alert"] = alert
            self.active[aid] = state
        for aid in list(self.active):
            if aid in touched:
                continue
            if aid in sustained:
                self.active[aid]["quiet"] = 0
                continue
            st = self.active[aid]
            st["quiet"] = st.get("quiet", 0) + 1
            if st["quiet"] >= self.cfg.clear_after:
                last: Alert = st["alert"]
                events.append(Alert("resolved", aid, pc.end_time, last.switch, last.port, last.ifname, last.direction,
                                    last.link, last.candidates, last.kind, last.estimated_rate, last.rate_ci, 0.0, 0,
                                    pc.pulse, pc.start_time, {}))
                del self.active[aid]
                # start the evidence afresh so that a resolved alert does not re-fire on old pulses
                for cell in self.cells.values():
                    if f"{self.switch}/{cell.port}/{cell.direction}" in aid:
                        for dq in (cell.r, cell.v, cell.e, cell.o, cell.scale, cell.t0):
                            dq.clear()
        return events

    # -- introspection (metrics, live view) ---------------------------------------------
    def port_scores(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, z in self.last_scores.items():
            cell = self.cells.get(key)
            if cell is not None and cell.kind != "corruption":
                out[cell.port] = max(out.get(cell.port, 0.0), z)
        return out

    @property
    def warming_up(self) -> bool:
        return self.pulses_used < self.cfg.warmup
