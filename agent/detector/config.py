"""Detector parameters and the false-alarm budget they derive from.

The operator states one number: how many false alerts per day the whole fabric
may raise (``fa_per_day``). With ``switches`` switches each closing
``pulse_hz`` pulses per second, every switch gets a per-pulse false-alarm
probability ``alpha = fa_per_day / (86400 * pulse_hz * switches)``; inside a
switch it is split evenly over the CUSUMs that judged the pulse (cells x loss
magnitudes, a cell's bank of magnitudes counted as the effective members its
correlation leaves: :mod:`agent.detector.banksplit`), so each CUSUM needs an
in-control average run length ``ARL0 = n_effective / alpha`` pulses, and its
threshold follows from :mod:`agent.detector.arl`.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum

from netns_testbed.errors import SpecError
from netns_testbed.untrusted import finite

SECONDS_PER_DAY = 86400.0


class Model(str, Enum):
    """Where the expected split of traffic over peer ports comes from."""

    ANALYTIC = "analytic"   # the fabric model's spray shares: judges from the first pulse
    LEARNED = "learned"     # measured in the first pulses, checked against the analytic ones

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DetectorConfig:
    """What the operator may tune; every statistical constant is derived from these."""

    model: Model = Model.ANALYTIC
    fa_per_day: float = 1.0            # false alerts per day, whole fabric
    pulse_hz: float = 1.0              # pulses (collective iterations) per second per switch, for the budget
    switches: int | None = None        # switches sharing the budget (default: the fabric's)
    magnitudes: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.02)  # loss rates the CUSUM bank is tuned to
    min_rate: float = 0.0005           # an alarm whose estimated rate is below this is not raised
    min_pulse_pkts: int = 200          # smaller pulses are background (pings, ARP): not judged
    min_cell_pkts: int = 20            # a cell (port, source) needs this many packets in a pulse
    fragment_share: float = 0.75       # a pulse below this share of the usual size is a stall's part: held and
                                       # judged with the pulses after it (agent.pulse.PulseAssembler); 0: off
    prior_dof: float = 20.0            # weight of the spray mode's theoretical noise factor, in samples
    certify_lag: int = 8               # a pulse is learned from only after this many quiet pulses
    quiet_level: float = 0.5           # "quiet": every CUSUM below this fraction of its threshold
    clear_lr: float = 100.0            # the least likelihood ratio for "repaired" that resolves an alert
    false_clears_per_day: float = 1.0  # an alert of a loss that stays resolves falsely at most this often a day
    corruption_background: float = 1e-7  # damaged frames per frame on a healthy link
    corruption_rate: float = 0.001     # corruption rate the damaged-frame CUSUM is tuned to
    learn_pulses: int = 8              # learned model: pulses per source group to measure its shares
    rotations: int = 0                 # rrdst/rr spray rotations (CPUs of the sprayer); 0: this machine's CPUs
    update_every: int = 16             # pulses between "update" events of an unchanged alert
    spine_test: bool = True            # spines judge each leaf's data balance (ring-shaped collectives)
    host_test: bool = True             # leaves compare the packets sent to each host with its peers'

    def validate(self) -> "DetectorConfig":
        def bad(name: str, why: str) -> SpecError:
            return SpecError(f"bad detector setting {name}={getattr(self, name)!r}: {why}")

        try:
            model = Model(self.model)
        except ValueError:
            raise SpecError(f"bad model {self.model!r}: analytic or learned") from None
        for name in ("fa_per_day", "pulse_hz", "min_rate", "prior_dof", "quiet_level", "clear_lr",
                     "false_clears_per_day", "corruption_background", "corruption_rate"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not finite(v) or v <= 0:
                raise bad(name, "must be a finite number > 0")
        if not isinstance(self.fragment_share, (int, float)) or isinstance(self.fragment_share, bool) \
                or not 0 <= self.fragment_share < 1:
            raise bad("fragment_share", "must be in [0, 1): 0 judges every pulse as it comes")
        if self.fa_per_day > 1e6:
            raise bad("fa_per_day", "at most 1e6 false alerts a day")
        if not self.magnitudes or any(not (0 < m < 1) for m in self.magnitudes):
            raise bad("magnitudes", "loss rates in (0, 1)")
        if not 0 < self.quiet_level < 1:
            raise bad("quiet_level", "must be in (0, 1)")
        if self.clear_lr <= 1:
            raise bad("clear_lr", "must be > 1")
        if self.corruption_rate <= self.corruption_background:
            raise bad("corruption_rate", "must exceed corruption_background")
        for name, low, high in (("min_pulse_pkts", 1, 10**9), ("min_cell_pkts", 1, 10**9), ("certify_lag", 1, 4096),
                                ("learn_pulses", 2, 4096), ("rotations", 0, 65536), ("update_every", 1, 10**6)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise bad(name, f"must be an integer in [{low}, {high}]")
        for name in ("spine_test", "host_test"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")
        if self.switches is not None and (not isinstance(self.switches, int) or self.switches < 1):
            raise bad("switches", "must be a positive integer")
        return self if model is self.model else replace(self, model=model)

    def alpha(self, fabric_switches: int) -> float:
        """Per-switch, per-pulse false-alarm probability from the fabric-wide daily budget."""
        n = self.switches or fabric_switches
        return min(0.5, self.fa_per_day / (SECONDS_PER_DAY * self.pulse_hz * n))

    @property
    def rotations_or_cpus(self) -> int:
        return self.rotations or os.cpu_count() or 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = str(self.model)
        d["magnitudes"] = list(self.magnitudes)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "DetectorConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SpecError(f"unknown detector setting(s) {sorted(unknown)}: allowed are {sorted(known)}")
        d = dict(data)
        if "magnitudes" in d and isinstance(d["magnitudes"], list):
            d["magnitudes"] = tuple(d["magnitudes"])
        return cls(**d).validate()
