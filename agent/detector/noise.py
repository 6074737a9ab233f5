"""The null variance of a check's deficits: a form per spray mode, factors learned per switch.

``V = phi[b] * u``: the check gives ``u`` (the form: multinomial ``N w (1 - w)``
for random spraying and round-robin, rotation quantisation ``R w (1 - w)`` for
rrdst) and a class ``b`` per cell; ``phi[b]`` is pooled over all cells of that
class on this switch. Random and rrdst use one class: their forms fit flows of
every size (recorded traces: random phi 0.97-1.08 from 150 to 10,000 packets;
rrdst r^2 0.30-0.34 at every size). Round-robin with one rotation per CPU does
not: a small flow (ACKs) lands on a rotation that other traffic keeps moving and
splits almost like random (phi 0.65), a big flow is broken only by the few
packets interleaved with it (phi 0.0097 at 10,000 packets). Its classes are
flow sizes in powers of 4.

Each class starts at its theoretical prior (worth ``prior_dof`` samples) and is
refined only from pulses certified healthy (see SwitchDetector), so a constant
deficit cannot teach the detector that it is noise. Each sample ``r^2 / u`` is
clipped at 16 ``phi`` (a 4-sigma Winsorisation) so one odd pulse cannot move it far.
"""
from __future__ import annotations

import numpy as np

CLIP = 16.0


class NoiseModel:
    def __init__(self, phi0: float | list[float], prior_dof: float, floor: float, min_phi: float = 0.0) -> None:
        self.phi0 = np.atleast_1d(np.asarray(phi0, dtype=float)).copy()
        self.prior_dof = float(prior_dof)
        self.floor = float(floor)
        self.min_phi = float(min_phi)     # the factor never learns below this (bursty noise: see HostCheck)
        self.ssq = np.zeros_like(self.phi0)
        self.n = np.zeros_like(self.phi0)

    @property
    def phis(self) -> np.ndarray:
        return np.maximum((self.prior_dof * self.phi0 + self.ssq) / (self.prior_dof + self.n), self.min_phi)

    @property
    def phi(self) -> float:
        """The factor of the best-learned class (what metrics show)."""
        return float(self.phis[int(np.argmax(self.n))])

    def variance(self, u: np.ndarray, cls: np.ndarray | int = 0) -> np.ndarray:
        return np.maximum(self.phis[cls] * u, self.floor)

    def sample(self, r: np.ndarray, u: np.ndarray, mask: np.ndarray, cls: np.ndarray | int = 0) -> tuple:
        """Per class (sum of clipped r^2/u, number of cells) of one pulse, to be learned once certified."""
        if not mask.any():
            return np.zeros_like(self.ssq), np.zeros_like(self.n)
        c = np.broadcast_to(cls, mask.shape)[mask]
        x = np.minimum(r[mask] ** 2 / u[mask], CLIP * self.phis[c])
        return (np.bincount(c, weights=x, minlength=len(self.phi0)),
                np.bincount(c, minlength=len(self.phi0)).astype(float))

    def learn(self, ssq: np.ndarray, n: np.ndarray) -> None:
        self.ssq += ssq
        self.n += n

    def state(self) -> dict:
        return {"ssq": self.ssq.tolist(), "n": self.n.tolist(), "phi0": self.phi0.tolist()}

    def load(self, d: dict) -> None:
        if not np.allclose(np.asarray(d.get("phi0", self.phi0), dtype=float), self.phi0):
            raise ValueError("saved noise prior differs")
        self.ssq = np.asarray(d["ssq"], dtype=float).reshape(self.phi0.shape)
        self.n = np.asarray(d["n"], dtype=float).reshape(self.phi0.shape)


class SpanNoise(NoiseModel):
    """The null variance of the owners' same-packet reference (:func:`agent.detector.checks.span_samples`):
    ``V = phi_e e + phi_r R`` per cell, with ``u = (e, R)``.

    ``e``: the segments the port should have received (the spray share of its flows' sequence spans);
    ``R``: the data segments it received below its flows' highest end and sent after the segment that
    moved it there (retransmissions, bpf/switch.h). Resent segments take the spray's rotation slots of
    first transmissions at the spine they cross, and the others' resent segments give them back: the
    deficit moves by about ``R_K - w R_all``, which the owner cannot see, so it is noise that grows with
    ``R``. Live, with overtaken first transmissions told apart by their IP ID, ``phi_r`` is 0.03 (it was
    4.8 when they counted as resent: a burst of them was a deficit at every spine). The two factors
    are :class:`NoiseModel`'s classes 0 and 1: ``phi_e`` is learned from certified-healthy cells
    without resent segments (``r^2 / e``), ``phi_r`` from those with them (``(r^2 - phi_e e) / R``),
    each from a measured prior worth ``prior_dof`` cells, each sample clipped at ``CLIP`` times its
    variance. The priors are live means (``bench/span_floor.py`` prints them).
    """

    def __init__(self, phi_e0: float, phi_r0: float, prior_dof: float, floor: float) -> None:
        super().__init__([phi_e0, phi_r0], prior_dof, floor)

    @property
    def phi(self) -> float:
        """The factor of the segments expected (what metrics show)."""
        return float(self.phis[0])

    def variance(self, u: np.ndarray, cls: np.ndarray | int = 0) -> np.ndarray:
        return np.maximum(u[..., 0] * self.phis[0] + u[..., 1] * self.phis[1], self.floor)

    def sample(self, r: np.ndarray, u: np.ndarray, mask: np.ndarray, cls: np.ndarray | int = 0) -> tuple:
        """(sums, counts) of the two factors' samples in one pulse, to be learned once certified."""
        if not mask.any():
            return np.zeros(2), np.zeros(2)
        e, R = u[mask, 0], u[mask, 1]
        x = np.minimum(r[mask] ** 2, CLIP * self.variance(u[mask]))
        quiet = R <= 0
        rest = np.maximum(x[~quiet] - self.phis[0] * e[~quiet], 0.0) / R[~quiet]
        return (np.array([float((x[quiet] / e[quiet]).sum()), float(rest.sum())]),
                np.array([float(quiet.sum()), float((~quiet).sum())]))
