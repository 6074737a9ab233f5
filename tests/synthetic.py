"""Synthetic leaf pulses with known truth: the peer test's noise model, exactly.

One leaf (leaf0 of a 4x4x2 fabric) receives ``n`` packets per pulse from each of
leaves 1..3, split over its 4 uplinks with shares ``w = 1/4`` plus Gaussian noise
of the spray mode's form (the detector's null model, with a chosen factor
``phi``): covariance ``phi * U * (diag(w) - w w^T) / (w (1 - w))``-shaped so the
four residuals sum to zero, with ``U = n w (1 - w)`` (random, rr) or
``R (1 - w^2) / 6`` (rrdst). A loss ``p`` on ``spine{k}->leaf0`` removes ``p`` of
that uplink's packets (binomially); retransmissions are re-sprayed evenly.
Counts are floats, so nothing is rounded away.
"""
from __future__ import annotations

import math

import numpy as np

from agent.detector.checks import rrdst_unit
from agent.detector.config import DetectorConfig
from agent.detector.evidence import Repair
from agent.pulse import PulseCounts
from netns_testbed.topo import Fabric, FabricSpec, SprayMode

FABRIC = Fabric(FabricSpec())
S = 4
W = np.full(S, 1 / S)


def unit_variance(spray: SprayMode, n: float, rotations: int) -> float:
    """The detector's variance form of a cell (its null model, taken from the detector itself)."""
    wq = W[0] * (1 - W[0])
    return n * wq if spray is not SprayMode.RRDST else float(rrdst_unit(W[0], rotations))


def leaf_pulses(spray: SprayMode, phi: float, n: float, pulses: int, rng: np.random.Generator, rotations: int = 2,
                fault: tuple[int, float, int] | None = None, fault_sources: tuple[int, ...] = (2,)
                ) -> list[PulseCounts]:
    """``fault``: (uplink k, loss rate, first faulty pulse) on the traffic of ``fault_sources``
    through k (default: one source, as in a ring, where the leaf hears one data sender)."""
    out = []
    scale = np.sqrt(phi * unit_variance(spray, n, rotations) / (n * W[0] * (1 - W[0])))
    for t in range(pulses):
        ip = np.zeros((6, 2, 6))
        for src in (2, 3, 4):                      # leaves 1..3 -> source classes 2..4
            x = np.sqrt(n * W) * rng.standard_normal(S)
            eps = scale * (x - W * x.sum())
            c = W * n + eps
            if fault and t >= fault[2] and src in fault_sources:
                k, p = fault[0], fault[1]
                lost = rng.binomial(int(round(c[k])), p)
                c[k] -= lost
                c += lost / S                      # the resent packets, re-sprayed
                c[k] -= lost / S * p               # (a few of them lost again)
            ip[:S, 0, src] = c
            ip[S, 1, src] = c.sum()                # delivered to host 0
        out.append(PulseCounts("leaf0", t + 1, ip, np.zeros((6, 2)), start_time=float(t), end_time=t + 0.5))
    return out


MIN_RATE, CLEAR_LR = DetectorConfig().min_rate, DetectorConfig().clear_lr


def repair_run(rng, delta: float, ln_a: float, repair_at: int | None, n_max: int) -> int | None:
    """One alert's repair test on a Gaussian stream of known truth: a loss of ``delta`` sd per pulse (its
    deficit with the loss's own binomial variance on top), repaired before pulse ``repair_at`` (None: it
    stays). The pulse it resolves at (counted from the repair), or None."""
    v, s = 100.0, 1000.0
    mu = delta * math.sqrt(v)
    rep = Repair()
    for t in range(1, n_max + 1):
        m = mu if repair_at is None or t < repair_at else 0.0
        r = float(rng.normal(m, math.sqrt(v + m)))
        if rep.update([(r, v, s)], 1.5 * mu / s, MIN_RATE, ln_a, math.log(CLEAR_LR)):
            return t if repair_at is None else t - repair_at
    return None


def run_lengths(spray: SprayMode, cfg: DetectorConfig, reps: int, n: float, seed: int, cap: int = 50_000) -> list[int]:
    """Per fresh detector (leaf0) on healthy pulses, the pulses to its first alert (``cap`` if none came:
    such a run is censored and reads short)."""
    from agent.detector import SwitchDetector
    from agent.detector.checks import peer_prior

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        det = SwitchDetector(FABRIC, "leaf0", cfg, spray)
        t, alerted = 0, False
        while not alerted and t < cap:
            for pc in leaf_pulses(spray, peer_prior(spray, n), n, 250, rng, rotations=cfg.rotations or 2):
                t += 1
                if any(a.event == "alert" for a in det.observe(pc)):
                    alerted = True
                    break
        out.append(t)
    return out
