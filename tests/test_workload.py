"""Real torch.distributed (gloo) jobs across host namespaces (root)."""
from __future__ import annotations

import statistics
import time

import pytest

from netns_testbed import faults
from netns_testbed.nsutil import pids_in_netns
from workload.launcher import JobSpec, placement, run_job

pytestmark = pytest.mark.root


def no_rank_left(tb) -> bool:
    return all(not pids_in_netns(tb.ns(h)) for h in tb.fabric.hosts)


def test_placement(default_testbed):
    assert placement(default_testbed, 8, "interleaved") == ["h0", "h2", "h4", "h6", "h1", "h3", "h5", "h7"]
    assert placement(default_testbed, 4, "contiguous") == ["h0", "h1", "h2", "h3"]


def test_allreduce_correct_and_bytes_on_the_wire(default_testbed, tmp_path):
    n, size = 4, 2 << 20
    res = run_job(default_testbed, JobSpec(size=size, iterations=6, idle_ms=100, ranks=n), tmp_path)
    assert res.ok, res.failure
    assert all(r["ok"] for r in res.ranks)  # every rank checked its result == sum of (rank+1)
    expect = 2 * (n - 1) / n * size
    for it in res.iterations[1:]:  # the first iteration also carries connection set-up
        # payload sent once (spurious retransmissions from spray reordering taken off)
        for payload in it["first_tx_payload"]:
            assert abs(payload - expect) / expect < 0.02, (payload, expect)
        # and the NIC put on the wire what TCP sent, retransmissions included: nothing duplicated or
        # lost on the way out. (It used to bound all wire bytes by 1.10 x expect: headers and ACKs
        # take ~7% and spurious retransmissions from spray reordering grow on a busy machine, 10.5%
        # in one CI run; that is TCP at work, not the testbed.) Tolerance: SACK blocks in ACK headers.
        for wire, once, again in zip(it["tx_payload"], it["first_tx_payload"], it["retrans_bytes"]):
            assert abs(wire - (once + again)) < 0.02 * expect, (wire, once, again)
    assert no_rank_left(default_testbed)


def test_ddp_trains_with_equal_bytes(default_testbed, tmp_path):
    res = run_job(default_testbed, JobSpec(workload="ddp", size=1 << 20, iterations=25, idle_ms=50, ranks=4), tmp_path)
    assert res.ok, res.failure
    losses = [it["loss"] for it in res.iterations]
    assert statistics.mean(losses[-5:]) < 0.7 * statistics.mean(losses[:5]), losses
    for it in res.iterations[2:]:
        tx = it["first_tx_payload"]
        assert (max(tx) - min(tx)) / statistics.mean(tx) < 0.01, tx


def test_job_completes_under_one_percent_drop(default_testbed, tmp_path):
    tb = default_testbed
    faults.apply(tb, faults.parse_fault(tb.fabric, "leaf1->spine2:drop=0.01"))
    try:
        res = run_job(tb, JobSpec(size=2 << 20, iterations=8, idle_ms=50), tmp_path)
        hit = faults.listing(tb)[0]["hit"]
    finally:
        faults.clear(tb)
    assert res.ok, res.failure
    assert hit > 0  # the fault really dropped packets of the job


def test_blackholed_host_fails_within_deadline_and_names_rank(default_testbed, tmp_path):
    tb = default_testbed
    hosts = placement(tb, 4, "interleaved")
    victim_rank = 2
    faults.apply(tb, faults.parse_fault(tb.fabric, f"{hosts[victim_rank]}->{tb.fabric.host_leaf(hosts[victim_rank])}:blackhole"))
    t0 = time.time()
    try:
        res = run_job(tb, JobSpec(size=1 << 20, iterations=5, idle_ms=50, ranks=4, gloo_timeout_s=8, deadline_s=60),
                      tmp_path)
    finally:
        faults.clear(tb)
    assert not res.ok
    assert time.time() - t0 < 60 + 10
    assert res.failed_rank is not None and res.failure
    assert no_rank_left(tb)
