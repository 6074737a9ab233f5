"""Pulse assembly: iterations that a stall cut into several pulses are judged whole (no root)."""
from __future__ import annotations

import numpy as np
import pytest

from agent.detector import DetectorConfig
from agent.pulse import PulseAssembler, PulseCounts, merge
from netns_testbed.errors import SpecError

USUAL = 20_000


def pulse(n: int, total: int, t: float | None = None) -> PulseCounts:
    ip = np.zeros((4, 2, 5), np.int64)
    ip[0, 0, 1] = total
    ip[1, 1, 2] = total // 2
    t = float(n) if t is None else t
    return PulseCounts("spine0", n, ip, np.zeros((4, 2), np.int64), start_ns=n * 10, end_ns=n * 10 + 5,
                       start_time=t, end_time=t + 0.3, data=ip.copy(), meta={"iter": n})


def feed(asm: PulseAssembler, sizes: list[int], first: int = 0) -> list[PulseCounts]:
    out = []
    for i, s in enumerate(sizes):
        pc = asm.push(pulse(first + i, s))
        if pc is not None:
            out.append(pc)
    return out


def test_whole_iterations_pass_through_unchanged():
    asm = PulseAssembler(0.75, 200)
    sizes = [USUAL, int(USUAL * 1.03), int(USUAL * 0.98)] * 5
    out = feed(asm, sizes)
    assert [p.pulse for p in out] == list(range(len(sizes)))
    assert all(p.merged == 1 and "fragments" not in p.meta for p in out)


def test_a_stall_split_iteration_is_judged_as_one_pulse():
    # live (allreduce, 8 MiB, busy machine): one iteration came as 0.09 + 0.50 + 0.43 of the usual size
    asm = PulseAssembler(0.75, 200)
    head = feed(asm, [USUAL] * 5)
    parts = [pulse(5, int(0.09 * USUAL)), pulse(6, int(0.50 * USUAL)), pulse(7, int(0.43 * USUAL))]
    assert asm.push(parts[0]) is None and asm.push(parts[1]) is None
    whole = asm.push(parts[2])
    assert len(head) == 5 and whole is not None
    assert whole.pulse == 7 and whole.meta["fragments"] == [5, 6, 7] and whole.meta["iter"] == 5
    assert whole.start_time == parts[0].start_time and whole.end_time == parts[2].end_time
    assert whole.start_ns == parts[0].start_ns and whole.end_ns == parts[2].end_ns
    assert (whole.ip == sum(p.ip for p in parts)).all() and (whole.data == sum(p.data for p in parts)).all()
    assert whole.merged == 3
    # and the next whole iteration is its own pulse again
    nxt = asm.push(pulse(8, USUAL))
    assert nxt is not None and nxt.pulse == 8 and nxt.merged == 1


def test_a_small_part_then_most_of_the_iteration():
    asm = PulseAssembler(0.75, 200)
    feed(asm, [USUAL] * 5)
    assert asm.push(pulse(5, int(0.09 * USUAL))) is None
    whole = asm.push(pulse(6, int(0.92 * USUAL)))
    assert whole is not None and whole.meta["fragments"] == [5, 6]


def test_a_job_that_shrinks_is_followed():
    """A job 8x smaller: folded a few pulses at a time until the median has followed it."""
    asm = PulseAssembler(0.75, 200)
    feed(asm, [USUAL] * 15)
    small = USUAL // 8
    out = feed(asm, [small] * 40, first=15)
    folded = [len(p.meta.get("fragments", [p.pulse])) for p in out]
    assert folded[0] == 6                       # 6 x 1/8 >= 3/4 of the old size
    assert folded[-10:] == [1] * 10             # then every pulse on its own
    assert sum(folded) <= 40 and sum(p.total for p in out) <= 40 * small * 1.5


def test_never_more_than_max_parts():
    asm = PulseAssembler(0.75, 200)
    feed(asm, [USUAL] * 15)
    out = feed(asm, [300] * 4 * PulseAssembler.MAX_PARTS, first=15)
    assert len(out[0].meta["fragments"]) == PulseAssembler.MAX_PARTS


def test_off_and_before_history():
    asm = PulseAssembler(0.0, 200)
    out = feed(asm, [USUAL, 100, USUAL // 10, USUAL])
    assert [p.pulse for p in out] == [0, 1, 2, 3]
    asm = PulseAssembler(0.75, 200)
    out = feed(asm, [USUAL // 10, USUAL, USUAL])   # nothing to compare with yet: judged as they come
    assert [p.pulse for p in out] == [0, 1, 2]


def test_merge_keeps_missing_data_missing():
    a, b = pulse(1, 500), pulse(2, 600)
    b.data = None
    m = merge([a, b])
    assert m.data is None and m.total == 1100


@pytest.mark.parametrize("share", [-0.1, 1.0, float("nan"), True])
def test_bad_fragment_share(share):
    with pytest.raises(SpecError, match="fragment_share"):
        DetectorConfig(fragment_share=share).validate()
