"""FlowPulse's per-switch detector (see switch.py for the per-pulse step).

Layout: ``config`` (parameters and the false-alarm budget), ``arl`` (CUSUM run
lengths and thresholds), ``evidence`` (CUSUM banks, reverse test), ``noise``
(null variance per spray mode, learned from certified pulses), ``checks`` (one
class per test), ``alerts`` (typed alerts, the book of open ones), ``switch``
(the SwitchDetector composing them).
"""
from agent.detector.alerts import Alert
from agent.detector.config import DetectorConfig, Model
from agent.detector.switch import SwitchDetector

__all__ = ["Alert", "DetectorConfig", "Model", "SwitchDetector"]
