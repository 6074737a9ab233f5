"""At the paper's scale (counter model, 32 leaves x 64 spines, 4.4 GB allreduce in 4 KB packets):
rrdst 0.1% is caught in the first faulty iteration and named (bench/scale.py's trial, the same code)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agent.detector import DetectorConfig

_spec = importlib.util.spec_from_file_location("bench_scale", Path(__file__).resolve().parents[1] / "bench" / "scale.py")
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)


def one(seed: int, base: DetectorConfig) -> dict:
    return scale.trial(64, "rrdst", 0.001, seed, int(4.4e9), onset=3, iters=2, leaves=32, hosts=4, mss=4096, base=base)


@pytest.mark.parametrize("seed", [0, 1])
def test_rrdst_0_1_percent_at_64_spines_caught_in_one_iteration_and_named(seed):
    r = one(seed, DetectorConfig())
    assert r["detected"] and r["iters"] == 1, r
    assert r["localized"] and not r["wrong_links"] and r["false"] == 0, r


def test_without_a_0_1_percent_member_it_is_not_caught():
    """The bank before (0.25-2%): the 0.25% CUSUM's drift is negative at 0.1%, nothing accumulates."""
    r = one(0, DetectorConfig(magnitudes=(0.0025, 0.005, 0.01, 0.02), min_rate=0.001))
    assert not r["detected"], r
