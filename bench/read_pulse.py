#!/usr/bin/env python3
"""Time to read one pulse of a big switch from the kernel's ring (root).

Loads the counting program (bpf/count.c) with the counter maps of a switch of the given shape
(default: 64 ports in a fabric of 64 leaves, 66 source classes), fills the slot of one pulse with
values on every CPU (half of them tagged with that pulse, half with an older one), and times what
the agent does per pulse (:meth:`CounterMaps.read_pulse`: one batch syscall for the slot, the
per-CPU values summed in numpy), beside the per-element Python summation the reader used before.
Nothing is attached to any interface.

For a machine with more CPUs than this one the figure is extrapolated: the copy scales with the
bytes read (elements x CPUs x 24 B), measured here as bytes per second of the batch syscall, and
the numpy sum is timed on a synthetic buffer of that many CPUs.

    sudo .venv/bin/python bench/read_pulse.py [--ports 64] [--leaves 64] [--reads 30] [--cpus 128]
"""
from __future__ import annotations

import argparse
import ctypes as ct
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import datapath as dp  # noqa: E402
from netns_testbed import bpfmaps  # noqa: E402
from netns_testbed.bpfmaps import PinnedArray, possible_cpus  # noqa: E402


class BenchMaps(dp.CounterMaps):
    def __init__(self, bpf_obj, shape: dp.SwitchShape) -> None:
        self.shape, self.nports, self.nsrc = shape, shape.nports, shape.nsrc
        self.maps = {name: PinnedArray(name, t, n, pc, fd=bpf_obj[name.encode()].map_fd)
                     for name, (t, n, pc) in dp.counter_map_entries(shape).items()}


def python_sum(arr: PinnedArray, first: int, n: int, pulse: int) -> list[list[int]]:
    """The summation the reader used before this change: one ctypes object per element and CPU."""
    buf = arr._batch(first, n)
    out = []
    for i in range(n):
        tot = [0] * dp.NKIND
        for c in range(arr.ncpu):
            v = dp.Count.from_buffer_copy(buf, (i * arr.ncpu + c) * arr._stride)
            if v.pulse == pulse:
                for k in range(dp.NKIND):
                    tot[k] += v.pkts[k]
        out.append(tot)
    return out


def timed(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ports", type=int, default=64)
    p.add_argument("--leaves", type=int, default=64)
    p.add_argument("--reads", type=int, default=30)
    p.add_argument("--cpus", type=int, default=128, help="CPU count to extrapolate to")
    a = p.parse_args()
    shape = dp.SwitchShape(a.ports, a.leaves, False, 0, 0)
    text = dp.source_text(dp.BPF_DIR / "count.c") + "\n" + dp.contract_asserts(shape)
    cflags = [f"-I{dp.BPF_DIR}", f"-DNPORTS={shape.nports}", f"-DNSRC={shape.nsrc}", f"-DFP_RING={shape.ring}"]
    t0 = time.perf_counter()
    bpf_obj, _ = dp.compile_program(text, cflags, ("fp_count_in", "fp_count_out"))
    print(f"compiled count.c for {a.ports} ports, {shape.nsrc} source classes, ring {shape.ring} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    maps = BenchMaps(bpf_obj, shape)
    ncpu, n = possible_cpus(), shape.ncounters
    pulse = 21
    counters = maps.maps["counters"]
    raw = (ct.c_char * (counters._stride * ncpu))()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for i in range(n):                         # fill the pulse's slot, every CPU its own value
        vals = np.frombuffer(raw, dtype=np.uint32).reshape(ncpu, -1)
        vals[:, 0] = pulse if i % 2 == 0 else pulse - shape.ring
        vals[:, 1:1 + dp.NKIND] = rng.integers(0, 1000, (ncpu, dp.NKIND))
        counters._update_raw((pulse % shape.ring) * n + i, raw)
    print(f"filled {n} elements x {ncpu} CPUs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    slot_first = (pulse % shape.ring) * n
    got = maps.read_pulse(pulse)
    ref = python_sum(counters, slot_first, n, pulse)
    assert got.counts.reshape(n, dp.NKIND).tolist() == ref, "numpy and Python sums differ"
    t_read = timed(lambda: maps.read_pulse(pulse), a.reads)
    t_copy = timed(lambda: counters._batch(slot_first, n), a.reads)
    t_py = timed(lambda: python_sum(counters, slot_first, n, pulse), 3)
    bytes_read = n * ncpu * counters._stride
    rate = bytes_read / t_copy
    big = np.zeros((n, a.cpus), dtype=bpfmaps._dtype(dp.Count))
    big["pulse"][::2] = pulse
    t_sum_big = timed(lambda: dp.sum_pulse(big, pulse), 5)
    big_bytes = n * a.cpus * counters._stride
    print(f"one pulse of a {a.ports}-port switch ({n} counters, {ncpu} CPUs here, median of {a.reads} reads):")
    print(f"  read_pulse (batch copy + numpy sum)   {t_read * 1e3:8.2f} ms   (copy alone {t_copy * 1e3:.2f} ms, "
          f"{bytes_read / 1e6:.1f} MB at {rate / 1e9:.2f} GB/s)")
    print(f"  per-element Python sum (before)       {t_py * 1e3:8.2f} ms   (median of 3)")
    print(f"  at {a.cpus} CPUs (extrapolated)            {(big_bytes / rate + t_sum_big) * 1e3:8.2f} ms   "
          f"(copy {big_bytes / 1e6:.0f} MB at the rate above: {big_bytes / rate * 1e3:.1f} ms; numpy sum "
          f"{t_sum_big * 1e3:.1f} ms)")
    maps.close()
    bpf_obj.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
