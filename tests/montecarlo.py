"""CUSUMs simulated as the detector runs them, for tests and benches with known truth.

Every member of a bank on the same standard normal stream ``x`` (the standardised deficit, in
control): ``S <- max(0, S + d x - d^2 / 2)``, alarm above ``h``.
"""
from __future__ import annotations

import numpy as np


def first_alarms(d: np.ndarray, h: np.ndarray, n: int, seed: int, until_any: bool = False) -> np.ndarray:
    """(n, members) pulses to each member's first alarm; all members driven by one stream per run.
    ``until_any``: a run stops at its first alarm of any member (the others stay 0)."""
    d = np.atleast_1d(np.asarray(d, dtype=float))
    h = np.atleast_1d(np.asarray(h, dtype=float))
    rng = np.random.default_rng(seed)
    stat = np.zeros((n, d.size))
    first = np.zeros((n, d.size))
    alive = np.ones(n, bool)
    t = 0
    while alive.any():
        t += 1
        idx = np.flatnonzero(alive)
        x = rng.standard_normal(idx.size)[:, None]
        stat[idx] = np.maximum(0.0, stat[idx] + d[None, :] * x - d[None, :] ** 2 / 2)
        new = (stat[idx] > h[None, :]) & (first[idx] == 0)
        first[idx] = np.where(new, t, first[idx])
        done = (first[idx] > 0).any(axis=1) if until_any else (first[idx] > 0).all(axis=1)
        alive[idx] = ~done
    return first


def bank_run_lengths(d: np.ndarray, h: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Per run the pulses to the bank's first alarm (any member)."""
    return first_alarms(d, h, n, seed, until_any=True).max(axis=1)
