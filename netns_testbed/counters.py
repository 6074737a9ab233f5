"""Per-port counter tables: what a switch counted, in the fabric model's names."""
from __future__ import annotations

from netns_testbed.datapath import DIRS, KINDS
from netns_testbed.state import Testbed


def port_rows(tb: Testbed, switches: list[str] | None = None) -> list[dict]:
    """One row per (switch, port, direction) with totals and per-kind packet counts."""
    rows = []
    for sw in switches or tb.fabric.switches:
        m = tb.maps(sw)
        try:
            c = m.totals()
        finally:
            m.close()
        for p in tb.fabric.ports[sw]:
            for d, dname in enumerate(DIRS):
                cell = c[p.index, d]
                row = {"switch": sw, "port": p.index, "ifname": p.ifname, "dir": dname,
                       "link": tb.fabric.link_of_port(sw, p.index, dname).name,
                       "pkts": int(cell[:, 0].sum()), "bytes": int(cell[:, 1].sum())}
                for k, kname in enumerate(KINDS):
                    row[kname] = int(cell[k, 0])
                rows.append(row)
    return rows
