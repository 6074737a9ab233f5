"""bpfmaps without root: per-CPU values summed in numpy
agree with summing the ctypes structures field by field (what the reader did before)."""
from __future__ import annotations

import ctypes as ct

import numpy as np
import pytest

from netns_testbed import bpfmaps
from netns_testbed import datapath as dp


@pytest.mark.parametrize("mirror", list(dp.C_STRUCTS.values()) + [dp.U64, dp.U32], ids=lambda m: m.__name__)
def test_numpy_layout_is_the_ctypes_layout(mirror):
    dt = bpfmaps._dtype(mirror)
    assert dt.itemsize == ct.sizeof(mirror)
    for name, _ in mirror._fields_:
        assert dt.fields[name][1] == getattr(mirror, name).offset


@pytest.mark.parametrize("value_type", [dp.Counter, dp.FaultStats, dp.U64, dp.U32], ids=lambda m: m.__name__)
def test_per_cpu_sums_in_numpy_equal_the_field_by_field_sums(value_type):
    rng = np.random.default_rng(1)
    arr = bpfmaps.PinnedArray.__new__(bpfmaps.PinnedArray)
    arr.value_type, arr.entries, arr.percpu, arr.ncpu = value_type, 37, True, 5
    arr._stride = (ct.sizeof(value_type) + 7) // 8 * 8
    buf = arr._buf(arr.entries)
    raw = np.frombuffer(buf, dtype=np.uint8)
    raw[:] = rng.integers(0, 256, raw.size, dtype=np.uint8)      # any bytes, padding included
    got = arr._summed(buf, arr.entries)
    for i in range(arr.entries):
        for name, _ in value_type._fields_:
            want = 0
            for c in range(arr.ncpu):
                v = value_type.from_buffer_copy(buf, (i * arr.ncpu + c) * arr._stride)
                want += getattr(v, name)
            bits = 8 * getattr(value_type, name).size
            assert int(got[name][i]) == want % (1 << bits), (i, name)   # unsigned counters wrap alike
    fields = arr._values(buf, arr.entries)
    assert [getattr(f, value_type._fields_[0][0]) for f in fields] == [int(x) for x in got[value_type._fields_[0][0]]]
