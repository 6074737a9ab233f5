#!/usr/bin/env python3
"""Job start-up benchmark: from `run_job` to the first iteration, and a whole short job (root).

Runs ``--jobs`` one-iteration allreduce jobs (1 MiB) with 8 ranks on a 4x4x2 testbed and
prints the medians: seconds from the launch to rank 0's first iteration (interpreters,
``import torch``, gloo rendezvous) and the job's wall time. Start-up is what every job in the
test suite and every experiment pays before its first packet.

    sudo .venv/bin/python bench/jobstart.py [--jobs 5] [--ranks 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns_testbed import builder  # noqa: E402
from netns_testbed.topo import FabricSpec  # noqa: E402
from workload.launcher import JobSpec, run_job  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--prefix", default="fpjs")
    a = p.parse_args()
    builder.down(a.prefix)
    tb = builder.up(a.prefix, FabricSpec())
    first, wall = [], []
    try:
        for k in range(a.jobs):
            out = Path(tempfile.mkdtemp(prefix="fpjs-"))
            t0 = time.time()
            res = run_job(tb, JobSpec(size=1 << 20, iterations=1, idle_ms=0, ranks=a.ranks), out)
            if not res.ok:
                print(f"job {k} failed: {res.failure}", file=sys.stderr)
                return 1
            start = json.loads((out / "progress.jsonl").read_text().splitlines()[0])["t"]
            first.append(start - t0)
            wall.append(res.wall_s)
            print(f"job {k}: first iteration after {first[-1]:.2f} s, wall {wall[-1]:.2f} s", file=sys.stderr)
    finally:
        builder.down(a.prefix)
    print(f"{a.ranks} ranks, {a.jobs} jobs: launch to first iteration {statistics.median(first):.2f} s, "
          f"job wall {statistics.median(wall):.2f} s (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
