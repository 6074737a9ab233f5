"""The shipped ARL table against its own computation and against Monte Carlo."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from agent.detector.arl import H_GRID, LOG2_DELTA, TABLE_PATH, arl_brook_evans, ln_arl_row, thresholds
from agent.detector.banksplit import budget_ln_arl
from tests.montecarlo import bank_run_lengths


def test_shipped_table_is_what_the_code_computes():
    """Regenerate a few rows: the table must not drift from agent/detector/arl.py."""
    table = json.loads(TABLE_PATH.read_text())
    for i in (0, 12, 24, 30, 40, len(LOG2_DELTA) - 1):
        fresh = ln_arl_row(2.0 ** LOG2_DELTA[i], H_GRID)
        assert np.allclose(table["ln_arl"][i], fresh, atol=1e-4), i


@pytest.mark.parametrize("delta,h", [(1.0, 4.0), (0.3, 3.0), (3.0, 3.0)])
def test_brook_evans_matches_monte_carlo(delta, h):
    """The Markov-chain ARL against 20,000 simulated CUSUM runs (standard error ~0.7%)."""
    stop = bank_run_lengths(np.array([delta]), np.array([h]), 20000, seed=0)
    assert stop.mean() == pytest.approx(arl_brook_evans(delta, h), rel=0.03)


def test_thresholds_give_the_required_arl():
    for ln_a in (math.log(1e4), math.log(1e8)):
        for delta in (0.1, 0.5, 1.0, 2.0):
            h = float(thresholds(np.array([delta]), ln_a)[0])
            got = math.log(arl_brook_evans(delta, h)) if h / delta <= 60 else None
            if got is not None and got < 20:
                assert got == pytest.approx(ln_a, abs=0.15), (delta, h, got)
    # a shift so large that even h = 0 is rarer than required gets the floor threshold
    assert thresholds(np.array([40.0]), math.log(1e6))[0] == pytest.approx(0.01)


def test_budget_counts_only_cusums_that_can_false_alarm():
    ln_alpha = math.log(1e-6)
    small = np.full(12, 0.5)               # can false-alarm: all count
    assert budget_ln_arl(small, ln_alpha) == pytest.approx(math.log(12) - ln_alpha)
    huge = np.concatenate([small, np.full(36, 40.0)])   # 36 that cannot: not counted
    assert budget_ln_arl(huge, ln_alpha) == pytest.approx(math.log(12) - ln_alpha)
    assert budget_ln_arl(small, ln_alpha, extra=6) == pytest.approx(math.log(18) - ln_alpha)
