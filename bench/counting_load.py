#!/usr/bin/env python3
"""The site agent's counting program loaded both ways, side by side: the compiled object through libbpf
(``counters: ebpf``) against a BCC compile at start (``counters: ebpf-bcc``) (root).

Each round loads the program for one site (a spine of a 4x4x2 fabric, four ports; nothing attached) in
a fresh Python process, once per build, alternated, and prints per build the median and range of the
time from the process's start to the loaded program (imports included) and of its peak resident memory.

    sudo .venv/bin/python bench/counting_load.py [--rounds 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import resource, sys, time
t0 = time.monotonic()
from pathlib import Path
from agent.counting import CountingProgram
from agent.site import load_site
site = load_site(Path(sys.argv[1]))
p = CountingProgram(site, [100 + i for i in range(len(site.ifnames))])
p.load()
took = time.monotonic() - t0
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
p.close()
"""


def site_file(tmp: Path, counters: str) -> Path:
    """spine1 of a 4x4x2 fabric, as ``fabric export-site`` would describe it."""
    sys.path.insert(0, str(ROOT))
    from types import SimpleNamespace

    from agent.site import dump_site, site_of_testbed
    from netns_testbed.topo import Fabric, FabricSpec

    tb = SimpleNamespace(fabric=Fabric(FabricSpec(leaves=4, spines=4, hosts_per_leaf=2)), out_of_service=[],
                         state=SimpleNamespace(gap_ms=50.0, spray="rrdst", weights={}))
    path = tmp / f"{counters}.yaml"
    path.write_text(dump_site({**site_of_testbed(tb, "spine1"), "counters": counters}))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="loads per build, alternated (default 5)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("counting_load: --rounds must be at least 1", file=sys.stderr)
        return 2
    builds = ("ebpf", "ebpf-bcc")
    got: dict[str, list[tuple[float, int]]] = {b: [] for b in builds}
    with tempfile.TemporaryDirectory(prefix="fp-load-") as tmp:
        sites = {b: site_file(Path(tmp), b) for b in builds}
        for r in range(args.rounds):
            for b in builds:
                out = subprocess.run([sys.executable, "-c", CHILD, str(sites[b])], cwd=ROOT, capture_output=True,
                                     text=True)
                if out.returncode != 0:
                    print(f"counting_load: {b}: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    return 1
                took, rss = out.stdout.split()
                got[b].append((float(took), int(rss)))
                print(f"counting_load: round {r + 1} {b}: {float(took):.2f} s, {int(rss) / 1024:.0f} MiB",
                      file=sys.stderr, flush=True)
    rows = []
    for b in builds:
        t = [x[0] for x in got[b]]
        m = [x[1] / 1024 for x in got[b]]
        rows.append({"counters": b, "runs": len(t), "load_s_median": round(statistics.median(t), 3),
                     "load_s_range": [round(min(t), 3), round(max(t), 3)],
                     "peak_rss_mib_median": round(statistics.median(m), 1)})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'counters':10} {'runs':>4} {'load s (median)':>16} {'range':>15} {'peak RSS MiB':>13}")
        for r in rows:
            print(f"{r['counters']:10} {r['runs']:>4} {r['load_s_median']:>16.2f} "
                  f"{r['load_s_range'][0]:>7.2f}-{r['load_s_range'][1]:<7.2f} {r['peak_rss_mib_median']:>13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
