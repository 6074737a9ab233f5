"""What an agent knows of the fabric it watches, wherever that knowledge came from.

An agent needs the fabric model (which port faces which neighbour, which leaves
send), how the leaves spray, which links are out of service, and where to keep
its detector state and exchange verdicts with the other switches' agents. A
testbed's state file gives all of that (:func:`of_testbed`); on any other machine
a site file does (``agent.site``). Nothing below this module reads either: the
detector, the incident tracker and the daemon take a :class:`Deployment`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from netns_testbed.topo import Fabric, Link, SprayChange, SprayMode

if TYPE_CHECKING:
    from agent.verdictpeers import PeerAccess


@dataclass(frozen=True)
class Deployment:
    name: str                          # testbed prefix or site file, for logs
    fabric: Fabric                     # with this machine's interface names on its switch's ports
    spray: SprayMode
    weights: dict[str, float]          # leafL->spineK -> relative weight (default 1)
    out_of_service: tuple[Link, ...]
    degraded: tuple[Link, ...]         # known lossy: not tested
    state_dir: Path                    # detector state, one file per switch
    verdict_dir: Path                  # verdict evidence each switch's agent exports and the others read
    reload: Callable[[], "Deployment"]  # SIGHUP: the same source read again
    per_source: bool = True            # the counts split packets by source leaf (not interface statistics)
    # The latest changes of the spray tables (drains, restores, weights), oldest first, read again when their
    # source changed; None: the deployment's links in service change only by reload (a site file).
    spray_changes: Callable[[], list[SprayChange]] | None = None
    # the fabric's verdict key (agent/verdictauth.py): verdict files are signed with it, and files without
    # its MAC are refused; None: unsigned files are written and read
    verdict_key: bytes | None = None
    # where the other switches' agents answer for their verdicts (agent/verdictpeers.py); None: verdict files
    peers: "PeerAccess | None" = None


def of_testbed(tb, degraded: list[str] | None = None) -> Deployment:
    """The deployment a running testbed describes (``tb``: netns_testbed.state.Testbed)."""
    from agent.verdictauth import ensure_key
    from netns_testbed.state import Testbed

    def reload() -> Deployment:
        return of_testbed(Testbed.load(tb.prefix), degraded)

    return Deployment(name=f"testbed {tb.prefix}", fabric=tb.fabric, spray=SprayMode.parse(tb.state.spray),
                      weights=dict(tb.state.weights), out_of_service=tuple(tb.out_of_service),
                      degraded=tuple(tb.fabric.parse_link_list(degraded)), state_dir=tb.dir / "detector",
                      verdict_dir=tb.dir / "verdicts", reload=reload, spray_changes=ChangeWatch(tb),
                      verdict_key=ensure_key(tb.dir / "verdict.key"))


class ChangeWatch:
    """The testbed's latest spray changes, from its state file: read again only when the file changed (one
    stat per call: each write replaces the file; a change's second write, its end, changes the size)."""

    def __init__(self, tb) -> None:
        self.tb = tb
        self.path = tb.dir / "state.json"
        self.key: tuple[int, int, int] | None = None
        self.changes: list[SprayChange] = []

    def __call__(self) -> list[SprayChange]:
        from netns_testbed.errors import StateError
        from netns_testbed.state import Testbed

        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self.changes         # going down: the agent stops on its own
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self.key:
            try:
                self.changes = Testbed.load(self.tb.prefix).spray_changes
            except StateError:
                return self.changes     # being taken down: nothing changes any more
            self.key = key
        return self.changes

