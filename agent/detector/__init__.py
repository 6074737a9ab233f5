"""FlowPulse's per-switch detector (see switch.py for the per-pulse step).

Layout: ``config`` (parameters and the false-alarm budget), ``arl`` (CUSUM run
lengths and thresholds), ``evidence`` (CUSUM banks, reverse test), ``noise``
(null variance per spray mode, learned from certified pulses), ``checks`` (one
class per test, each a ``Check``), ``alerts`` (typed alerts, the book of open ones),
``lifecycle`` (alarms into alerts, asymmetry, repair), ``owner`` (verdict evidence
on the links the switch owns), ``persistence`` (saved state), ``switch`` (the
SwitchDetector stepping them).
"""
from __future__ import annotations

from importlib import import_module

# Loaded when first asked for (PEP 562), so that the CLI can take ``Model`` from ``config`` for its
# flags without importing the detector's numerical modules.
_NAMES = {"Alert": "agent.detector.alerts", "DetectorConfig": "agent.detector.config",
          "Model": "agent.detector.config", "SwitchDetector": "agent.detector.switch"}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'agent.detector' has no attribute {name!r}")

__all__ = ["Alert", "DetectorConfig", "Model", "SwitchDetector"]
