"""What a switch tells the others about the links it owns: its verdict evidence.

Each directed link is owned by its downstream switch: a spine judges the links into it from its own
balance and same-packet reference, a leaf the paths into it (``leafA->spineK->leafM``). The incident
tracker asks an owner, through :class:`OwnerService`, for its evidence on a link since an alert's onset
(see :mod:`agent.detector.verdict` for the statistics and :mod:`agent.incidents` for the asking).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.detector.alerts import AlertBook, AlertKind
from agent.detector.checks import Check, PeerCheck, SpineCheck, path_name
from agent.detector.verdict import Ledger, LinkEvidence, Span, evidence_from, path_evidence
from netns_testbed.topo import Fabric, Link, node_kind, node_num


class OwnerService:
    """Over a switch detector's checks (whose ledgers keep the evidence) and its alert book (an open loss
    alert on a link is part of the verdict)."""

    def __init__(self, fabric: Fabric, switch: str, checks: list[Check], book: AlertBook) -> None:
        self.fabric, self.switch, self.checks, self.book = fabric, switch, checks, book
        self.is_leaf = node_kind(switch) == "leaf"

    @property
    def ledger(self) -> Ledger | None:
        """The per-pulse evidence behind this switch's verdicts: a spine's on the links into it, a leaf's
        on the paths into it (when its counts carry sequence spans; see :meth:`owned_cells`)."""
        checks = self.checks
        spine = next((c.ledger for c in checks if isinstance(c, SpineCheck)), None)
        if spine is not None:
            return spine
        return next((c.path_ledger for c in checks if type(c) is PeerCheck and c.path_ledger.rows), None)

    def owned_cells(self) -> dict[str, int]:
        """What this switch gives verdicts on -> its ledger cell: a spine the links into it
        (``leafA->spineK``) and, with the same-packet reference, each of them for the flows towards one
        leaf (``leafA->spineK->leafM``); a leaf the paths into it (``leafA->spineK->leafM``: the
        same-packet reference of leaf A's flows through spine K, lossy whether ``leafA->spineK`` or
        ``spineK->leafM`` drops)."""
        chk = next((c for c in self.checks if isinstance(c, SpineCheck)), None)
        if chk is None:
            peer = next((c for c in self.checks if type(c) is PeerCheck), None)
            if peer is None or not peer.path_ledger.rows:
                return {}
            return {path_name(int(a), int(k), self.switch): peer.path_cell(int(a), int(k))
                    for a, k in zip(*np.nonzero(peer.usable))}
        links = [Link(p.peer, self.switch) for p in self.fabric.ports[self.switch]]
        out = {l.name: cell for l in links if (cell := chk.owned_cell(l)) is not None}
        for l in links:                 # per destination leaf: the flows a leaf's path evidence counts
            if l.name in out:
                out.update({f"{l.name}->leaf{b}": cell for b in range(chk.L)
                            if (cell := chk.path_cell(node_num(l.src), b)) is not None})
        return out

    def path_evidence(self, name: str, since: float | Sequence[Span]) -> LinkEvidence | None:
        """A leaf's same-packet evidence on a path into it (``leafA->spineK->`` this leaf) from pulses that
        started at or after ``since``; None if it keeps none."""
        cell = self.owned_cells().get(name) if self.is_leaf else None
        if cell is None:
            return None
        return path_evidence(self.ledger, cell, since, name, self.switch)

    def open_loss_links(self) -> set[str]:
        return self.open_links(AlertKind.LOSS)

    def open_links(self, kind: AlertKind) -> set[str]:
        """The links this switch's open alerts of ``kind`` name (a corruption's: the links into it whose
        frames arrive damaged, its own damaged-frame test)."""
        return {oa.alert.link for oa in self.book.open.values() if oa.alert.kind is kind and oa.alert.link}

    def owned_evidence(self, link: Link, since: float | Sequence[Span], loss: float,
                       toward: str | None = None) -> LinkEvidence | None:
        """This switch's evidence on a link it owns, from pulses that started at or after ``since``, for an
        alert of rate ``loss`` (its pulse timing, see :func:`evidence_from`); None if it does not judge
        that link. ``toward``: a leaf, for the evidence on the link's flows towards it alone (a spine's
        cell per destination leaf, see :meth:`SpineCheck._span`), named ``<link>-><leaf>``."""
        name = link.name if toward is None else f"{link.name}->{toward}"
        cell = self.owned_cells().get(name)
        if cell is None:
            return None
        return evidence_from(self.ledger, cell, since, name, self.switch,
                             link.name in self.open_loss_links(), loss)
