"""At the paper's scale (counter model, 32 leaves x 64 spines, 4.4 GB allreduce in 4 KB packets):
rrdst 0.1% is caught in the first faulty iteration and named (bench/scale.py's trial, the same code)."""
from __future__ import annotations

import importlib.util
import math
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


def test_the_floors_mixture_keeps_its_budget_and_is_slower_than_the_told_the_link_cusum():
    """The bench's floor (bench/scale.py ``floor``) must not flatter a target: the Shiryaev-Roberts
    mixture's sum less ``ports x n`` is a martingale with no change, so its null ARL is at least its
    threshold over the ports (optional stopping), and the calibrated ``kappa`` says by how much; told
    the rate but not the port, it cannot beat the CUSUM told both at the same ARL (Lorden's bound)."""
    import math

    import numpy as np

    rng = np.random.default_rng(3)
    ports, delta, ln_b = 8, 1.0, 5.0
    t = scale._sr_mixture_run(ports, delta, ln_b, 2000, rng, faulty=False)
    se = t.std() / math.sqrt(t.size)
    assert t.mean() + 3 * se >= math.exp(ln_b) / ports, (t.mean(), se)
    # the floor at a budget of e^8 per switch-pulse, 8 ports, a shift of 1 sd per iteration (rate 1%,
    # 10,000 packets per uplink, 64 spines): the mixture or the per-port CUSUMs, above the told-the-link CUSUM
    floor, kappa = scale.floor_iters(0.01, 9844, 64, ports, 8.0, reps=2000, seed=1)
    told = scale.optimal_iters(0.01, 9844, 64, 8.0)
    assert 1.0 < kappa < 6.0, kappa
    assert floor > told, (floor, told)


def test_opt_cells_shares_the_budget_over_the_cells_the_detector_judged():
    """``opt/cells``' ARL is ``cells / alpha``, the cells the detector judged: below its per-CUSUM ARL by
    ln of the bank's effective members per cell, at most ln(magnitudes) and less where members overlap
    (measured: about 2 of 5 on a 4x4 fabric, where subtracting ln 5 understated opt/cells' threshold by
    about 0.9 nats). With a bank of one magnitude a cell counts at most once (members that cannot
    false-alarm at the ARL count 0), so the per-CUSUM ARL is at most ``cells / alpha``."""
    m = len(DetectorConfig().magnitudes)
    small = dict(spines=4, spray="rrdst", rate=0.01, seed=1, size=int(0.5e9), onset=5, iters=1, leaves=4, hosts=2,
                 mss=9000)
    bank = scale.trial(**small)
    cells = math.exp(bank["ln_arl_cells"]) * DetectorConfig().alpha(8)
    assert cells == pytest.approx(round(cells), rel=1e-9) and cells >= 4 * 2, bank   # whole cells, every uplink
    assert 0.3 < bank["ln_arl"] - bank["ln_arl_cells"] < math.log(m) - 0.5, bank
    one_member = scale.trial(**small, base=DetectorConfig(magnitudes=(0.01,), min_rate=0.005))
    assert one_member["ln_arl"] <= one_member["ln_arl_cells"] + 1e-9, one_member
