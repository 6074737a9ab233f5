"""What a running testbed is: its fabric model and settings, saved under /run.

The state file is how other processes (CLI, agents, workload, experiments) find
a testbed; cleanup never depends on it (``down`` reads the kernel), so a lost or
half-written state file cannot leave anything behind.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from netns_testbed.errors import SpecError, StateError
from netns_testbed.safefiles import write_atomic
from netns_testbed.topo import Fabric, Hook, Link, SprayChange, SprayMode, check_prefix, namespace

RUN_DIR = Path(os.environ.get("FLOWPULSE_RUN_DIR", "/run/flowpulse"))


def state_dir(prefix: str) -> Path:
    return RUN_DIR / check_prefix(prefix)


@dataclass
class TestbedState:
    """Settings of a testbed that every reader needs."""

    prefix: str
    fabric: dict
    spray: SprayMode = SprayMode.RRDST
    gap_ms: float = 50.0
    weights: dict[str, float] = field(default_factory=dict)
    out_of_service: list[str] = field(default_factory=list)
    datapath: bool = True
    status: str = "building"
    created: float = 0.0
    faults: dict[str, dict] = field(default_factory=dict)
    hook: Hook = Hook.CLSACT  # how the switch programs are attached
    drained: list[str] = field(default_factory=list)    # taken out of service while up (netns_testbed.drain)
    epoch: int = 0                                      # spray changes so far
    changes: list[dict] = field(default_factory=list)   # the latest ones (SprayChange as a dict), oldest first

    def __post_init__(self) -> None:
        # the state file holds their values: typed here, once, for every reader
        self.spray = SprayMode.parse(self.spray)
        self.hook = Hook(self.hook)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


class Testbed:
    """A handle on a testbed that is up: its model, its namespaces, its maps."""

    __test__ = False  # not a pytest test class

    def __init__(self, state: TestbedState) -> None:
        self.state = state
        self.prefix = state.prefix
        self.fabric = Fabric.from_dict({"spec": state.fabric})
        self.dir = state_dir(state.prefix)

    @classmethod
    def load(cls, prefix: str) -> "Testbed":
        path = state_dir(prefix) / "state.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise StateError(f"no testbed with prefix {prefix!r} is up: start one with `flowpulse fabric up --prefix {prefix}`") from None
        except json.JSONDecodeError:
            raise StateError(f"state of testbed {prefix!r} is damaged: run `flowpulse fabric down --prefix {prefix}` and up again") from None
        st = TestbedState(**data)
        if st.status != "up":
            raise StateError(f"testbed {prefix!r} is {st.status}, not up: run `flowpulse fabric down --prefix {prefix}` and up again")
        return cls(st)

    def ns(self, node: str) -> str:
        return namespace(self.prefix, node)

    @property
    def out_of_service(self) -> list[Link]:
        """Every link the leaves do not spray over: out of service since the build, or drained since."""
        return self.fabric.links_named({l.name for l in self.fabric.parse_link_list(self.state.out_of_service)}
                                       | set(self.state.drained))

    @property
    def drained(self) -> list[Link]:
        return self.fabric.links_named(self.state.drained)

    @property
    def latest_change(self) -> SprayChange | None:
        return change_from_dict(self.fabric, self.state.changes[-1]) if self.state.changes else None

    @property
    def spray_changes(self) -> list[SprayChange]:
        """The latest spray changes, oldest first (netns_testbed.drain keeps MAX_CHANGES)."""
        return [change_from_dict(self.fabric, d) for d in self.state.changes]

    def save(self) -> None:
        write_state(self.state)

    @contextlib.contextmanager
    def locked(self) -> Iterator["Testbed"]:
        """Serialise read-modify-write of the state (two `fault add` at once)."""
        with open(self.dir / "lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            fresh = Testbed.load(self.prefix)
            self.state = fresh.state
            yield self

    def maps(self, switch: str, readonly: bool = False):
        from netns_testbed.datapath import SwitchMaps

        if not self.state.datapath:
            raise StateError(f"testbed {self.prefix!r} runs without the eBPF datapath: no counters or faults")
        return SwitchMaps(self.fabric, self.dir, switch, readonly=readonly)


def change_to_dict(c: SprayChange) -> dict:
    return {"epoch": c.epoch, "action": c.action, "links": [l.name for l in c.links],
            "out_of_service": [l.name for l in c.out_of_service], "t0_ns": c.t0_ns, "t1_ns": c.t1_ns,
            "weights": dict(c.weights)}


SPRAY_CHANGE_KEYS = ("epoch", "action", "links", "out_of_service", "t0_ns", "t1_ns", "weights")
SPRAY_CHANGE_ACTIONS = ("drain", "restore", "weight")


def change_from_untrusted(fabric: Fabric, d, where: str) -> SprayChange:
    """A spray change from input this process did not write (a feed's header): every field checked,
    :class:`SpecError` with one line naming ``where`` and the field otherwise. (A run's report is checked
    against analysis/report.schema.json, which states the same shape.)"""
    def bad(why: str) -> SpecError:
        return SpecError(f"{where}: {why}")

    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63

    if not isinstance(d, dict) or set(d) != set(SPRAY_CHANGE_KEYS):
        raise bad(f"a spray change is an object with exactly {', '.join(SPRAY_CHANGE_KEYS)}")
    if not whole(d["epoch"]) or d["epoch"] < 1:
        raise bad("'epoch' must be a whole number >= 1")
    if d["action"] not in SPRAY_CHANGE_ACTIONS:
        raise bad(f"'action' {d['action']!r}: one of {', '.join(SPRAY_CHANGE_ACTIONS)}")
    for k in ("links", "out_of_service"):
        if not isinstance(d[k], list) or len(d[k]) > 10000 or not all(isinstance(x, str) for x in d[k]):
            raise bad(f"{k!r} must be a list of link names")
    if not whole(d["t0_ns"]) or not (d["t1_ns"] is None or (whole(d["t1_ns"]) and d["t1_ns"] >= d["t0_ns"])):
        raise bad("'t0_ns' must be a whole number of ns, 't1_ns' null or one not before it")
    w = d["weights"]
    if not isinstance(w, dict) or len(w) > 10000 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1000 for v in w.values()):
        raise bad("'weights' must map uplinks to numbers in (0, 1000]")
    try:
        fabric.links_named(w)
        return change_from_dict(fabric, d)
    except SpecError as e:
        raise bad(str(e)) from None


def change_from_dict(fabric: Fabric, d: dict) -> SprayChange:
    return SprayChange(int(d["epoch"]), str(d["action"]), tuple(fabric.links_named(d["links"])),
                       tuple(fabric.links_named(d["out_of_service"])), int(d["t0_ns"]),
                       None if d["t1_ns"] is None else int(d["t1_ns"]),
                       tuple(sorted((str(k), float(v)) for k, v in (d.get("weights") or {}).items())))


def write_state(state: TestbedState) -> None:
    write_atomic(state_dir(state.prefix) / "state.json", state.to_json(), mode=0o644)


LOCK_WAIT_S = 120.0


@contextlib.contextmanager
def prefix_lock(prefix: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold testbed ``prefix``'s lock: ``up`` and ``down`` of one prefix never run at once (two `fabric
    up` of one prefix: the loser's clean-up removed the winner's testbed). ``wait_s`` 0: fail at once
    if another process holds it. The lock file (``RUN_DIR/.<prefix>.lock``) is removed by ``down``
    while held; a process that opened it before then finds another inode on the path and tries again.
    """
    import time

    RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = RUN_DIR / f".{check_prefix(prefix)}.lock"
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise StateError(f"testbed {prefix!r} is being built or removed by another process: wait for "
                                 f"it to finish (`flowpulse fabric status --prefix {prefix}`), then retry") from None
            time.sleep(0.1)
            continue
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)               # removed (or replaced) under us: the lock is on another file now
    try:
        yield
    finally:
        os.close(fd)


def remove_prefix_lock(prefix: str) -> None:
    """Called by ``down`` while it holds the lock: nothing of the testbed is left behind."""
    with contextlib.suppress(FileNotFoundError):
        (RUN_DIR / f".{check_prefix(prefix)}.lock").unlink()
