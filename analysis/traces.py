"""Load recorded per-pulse counters (tests/data/pulse-traces format) as PulseCounts.

The recorded rig names switches ``fm_lL``/``fm_sK`` and numbers ports and
source classes exactly as the fabric model does (leaf: uplinks 0..S-1 then
hosts; src: source leaf + 1, 0 other IPv4, 7 not IPv4), so the mapping is a
rename. Only pulses that overlap an iteration are returned, in order.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.pulse import PulseCounts
from netns_testbed.topo import Fabric, FabricSpec


@dataclass
class Trace:
    tag: str
    spray: str
    fault_p: float
    fabric: Fabric
    pulses: dict[str, list[PulseCounts]]   # switch -> pulses in order
    fault_link: str | None
    fault_iter: int | None
    meta: dict


def _switch_name(raw: str) -> str:
    return ("leaf" if raw.startswith("fm_l") else "spine") + raw[4:]


def is_trace(directory: Path) -> bool:
    return any((Path(directory) / n).exists() for n in ("pulses.csv", "pulses.csv.gz"))


def open_pulses(directory: Path) -> io.TextIOBase:
    """``pulses.csv``, or the compressed copy the repository ships (``pulses.csv.gz``)."""
    plain = Path(directory) / "pulses.csv"
    if plain.exists():
        return open(plain, newline="")
    return io.TextIOWrapper(gzip.open(Path(directory) / "pulses.csv.gz"), newline="")


def load_trace(directory: Path, fault_link: str = "spine1->leaf2", fault_iter: int = 15) -> Trace:
    directory = Path(directory)
    meta = json.loads((directory / "meta.json").read_text())
    fabric = Fabric(FabricSpec(leaves=4, spines=4, hosts_per_leaf=2))
    nsrc = fabric.spec.leaves + 2
    cells: dict[tuple[str, int], dict] = {}
    tag, spray, fault_p = directory.name, "rrdst", 0.0
    with open_pulses(directory) as f:
        for row in csv.DictReader(f):
            tag, spray, fault_p = row["tag"], row["choice"], float(row["fault_p"])
            if row["iter"] == "":
                continue
            sw = _switch_name(row["switch"])
            key = (sw, int(row["pulse"]))
            c = cells.get(key)
            if c is None:
                n = len(fabric.ports[sw])
                c = cells[key] = {"ip": np.zeros((n, 2, nsrc), np.int64), "bad": np.zeros((n, 2), np.int64),
                                  "data": np.zeros((n, 2, nsrc), np.int64), "iter": int(row["iter"])}
            d = 0 if row["dir"] == "in" else 1
            kind, src, slot = int(row["kind"]), int(row["src"]), int(row["slot"])
            if kind <= 2:
                c["ip"][slot, d, src if src <= fabric.spec.leaves else 0] += int(row["pkts"])
            if kind == 0:
                c["data"][slot, d, src if src <= fabric.spec.leaves else 0] += int(row["pkts"])
    times = {p["pulse"]: p for p in meta.get("pulses", [])}
    out: dict[str, list[PulseCounts]] = {sw: [] for sw in fabric.switches}
    for (sw, pulse), c in sorted(cells.items(), key=lambda kv: kv[0][1]):
        t = times.get(pulse, {})
        out[sw].append(PulseCounts(sw, pulse, c["ip"], c["bad"], start_time=t.get("t_start", 0.0),
                                   end_time=t.get("t_end", 0.0), meta={"iter": c["iter"]}, data=c["data"]))
    faulty = fault_p > 0
    return Trace(tag, spray, fault_p, fabric, out, fault_link if faulty else None, fault_iter if faulty else None, meta)
